"""Long-run check of the packer against an exact DP on exact token counts.

Random instances of 20-400 candidates in five styles (uniform, memory-sized log-normal,
small items, weakly and strongly correlated score/size), budgets up to 6,000 tokens; each
packed on both paths (DP, and the fallback forced by a one-cell ceiling), with and without
the branch-and-bound step. Prints the worst value/optimum ratio and how many results were
proven optimal, per style and configuration.

    python tools/pack_stress.py [SEED] [INSTANCES]
"""

from __future__ import annotations

import random
import sys

import numpy as np

import ctxcore


def exact(tokens: list[int], scores: list[float], capacity: int) -> float:
    dp = np.zeros(capacity + 1)
    for t, v in zip(tokens, scores):
        if t <= capacity:
            np.maximum(dp[t:], dp[:-t] + v, out=dp[t:])
    return float(dp[capacity])


def main(seed: int, instances: int) -> None:
    rng = random.Random(seed)
    worst: dict[tuple[str, str, str], float] = {}
    proven: dict[tuple[str, str, str], int] = {}
    count: dict[tuple[str, str, str], int] = {}
    for _ in range(instances):
        n = rng.randint(20, 400)
        style = rng.choice(["uniform", "correlated", "memory", "small", "strong"])
        tokens, scores = [], []
        for _ in range(n):
            if style == "small":
                t = rng.randint(1, 40)
            elif style == "memory":
                t = int(rng.lognormvariate(4.6, 0.7)) + 1
            else:
                t = rng.randint(1, 400)
            tokens.append(t)
            scores.append(t / 100 + 0.1 if style == "correlated" else t + 10.0 if style == "strong" else rng.random())
        budget = rng.randint(1, min(6000, sum(tokens)))
        ids = [f"m{i}" for i in range(n)]
        best = exact(tokens, scores, budget)
        for path, ceiling in (("dp", ctxcore.DEFAULT_CELL_CEILING), ("fallback", 1)):
            for search, nodes in (("search", ctxcore.DEFAULT_SEARCH_NODE_LIMIT), ("no-search", 0)):
                res = ctxcore.pack_arrays(ids, tokens, scores, budget, cell_ceiling=ceiling, search_node_limit=nodes)
                assert res.tokens_used <= budget
                key = (style, path, search)
                worst[key] = min(worst.get(key, 1.0), res.total_score / best if best > 0 else 1.0)
                proven[key] = proven.get(key, 0) + res.proven_optimal
                count[key] = count.get(key, 0) + 1
    for key in sorted(worst):
        print(f"{'/'.join(key):32s} worst {worst[key]:.5f}  proven optimal {proven[key]}/{count[key]}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 0, int(sys.argv[2]) if len(sys.argv) > 2 else 500)
