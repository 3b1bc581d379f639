"""Long-run check of grouped packing (``pack_arrays(..., groups=...)``) against the exact
multiple-choice optimum.

Random instances of every family of `ctxcore.benchmarking.instances`, a share of the
candidates (10-100%) put in groups of 2-10, packed on both paths (the DP, and the fallback
forced by a one-cell ceiling). Checks on every instance that no group has two members in,
that the budget holds, that the upper bound is above the optimum and that every result
proven optimal is the optimum; prints, per family and path, the worst value/optimum ratio
and the time per pack.

    python tools/pack_groups_stress.py [--seed S] [--instances N] [--max-n 800]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

import ctxcore
from ctxcore.benchmarking.instances import PACK_FAMILIES, pack_instance
from ctxcore.benchmarking.references import numpy_mckp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--instances", type=int, default=160)
    parser.add_argument("--max-n", type=int, default=800)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    worst: dict[tuple[str, str], float] = defaultdict(lambda: 1.0)
    proven: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    times: list[float] = []
    for trial in range(args.instances):
        family = PACK_FAMILIES[trial % len(PACK_FAMILIES)]
        n = int(rng.integers(100, args.max_n + 1))
        tokens, scores = pack_instance(family, n, rng)
        share = float(rng.choice([0.1, 0.3, 0.6, 1.0]))
        size = int(rng.choice([2, 3, 5, 10]))
        groups = np.where(rng.random(n) < share, rng.integers(0, max(1, int(n * share / size)), n), -1)
        budget = int(rng.integers(1, max(2, min(int(tokens.sum()), 40_000))))
        optimum = numpy_mckp(tokens, scores, groups, budget)
        ids = [f"c{i}" for i in range(n)]
        for path, ceiling in (("dp", 1 << 20), ("fallback", 1)):
            t0 = time.perf_counter()
            res = ctxcore.pack_arrays(ids, tokens, scores, budget, groups=groups, cell_ceiling=ceiling)
            times.append(time.perf_counter() - t0)
            labels = groups[res.indices]
            labels = labels[labels >= 0]
            assert len(set(labels.tolist())) == labels.size, f"trial {trial}: two members of one group"
            assert res.tokens_used <= budget, f"trial {trial}: over budget"
            assert res.upper_bound >= optimum * (1 - 1e-9), f"trial {trial}: upper bound below the optimum"
            ratio = res.total_score / optimum if optimum > 0 else 1.0
            if res.proven_optimal:
                assert ratio >= 1 - 1e-9, f"trial {trial}: proven optimal at {ratio}"
            key = (family, path)
            worst[key] = min(worst[key], ratio)
            proven[key][0] += int(res.proven_optimal)
            proven[key][1] += 1
    for key in sorted(worst):
        print(
            f"{key[0]:>17} {key[1]:>8}: worst {worst[key]:.6f} of the optimum, proven {proven[key][0]}/{proven[key][1]}"
        )
    print(f"{len(times)} packs: median {np.median(times) * 1e3:.2f} ms, max {max(times) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
