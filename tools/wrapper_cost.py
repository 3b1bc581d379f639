#!/usr/bin/env python3
"""The memory wrapper's cost per tokenizer family: tokens an element adds beside its
body, in the compact and verbose renderings, and the safety sentences' cost.

    python tools/wrapper_cost.py            # a Markdown table
    python tools/wrapper_cost.py --json

Families with an exact tokenizer installed (`ctxcore.exact_families()`) are counted
exactly; the others with ctxcore's conservative estimator (what assembly charges them).
The memories are conversational turns of 10-40 words with UUID store ids.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import uuid
from collections.abc import Callable

import ctxcore
from ctxcore.formatting import COMPACT_SAFETY_SENTENCE

WORDS = (
    "the support group was really moving and I went there on Friday with my friends after work "
    "because she said it would help us talk about the adoption plans next summer"
).split()


def _memories(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(10, 40))]
        out.append(
            {"id": str(uuid.UUID(int=rng.getrandbits(128))), "text": "Caroline: " + " ".join(words).capitalize() + "."}
        )
    return out


def _counter(family: str) -> Callable[[str], int]:
    if family in ctxcore.exact_families():
        return lambda s: ctxcore.count_tokens(s, family).value
    return lambda s: ctxcore.estimate_tokens(s, family).value


def measure(family: str, n: int = 200, seed: int = 0) -> dict[str, float | str]:
    count = _counter(family)
    mems = _memories(n, seed)
    out: dict[str, float | str] = {
        "family": family,
        "counted": "exact" if family in ctxcore.exact_families() else "estimate",
    }
    for fmt, sentence in (("compact", COMPACT_SAFETY_SENTENCE), ("verbose", ctxcore.SAFETY_SENTENCE)):
        scored = [{**m, "score": 0.8731, "source": "vector"} for m in mems]
        ctx = ctxcore.format_context(memories=scored, memory_format=fmt)
        section = ctx.sections["memories"]
        frame = "<memories>\n" + sentence
        elements = section[len(frame) : -len("\n</memories>")]
        own = sum(count(m["text"]) for m in mems)
        out[f"{fmt}_per_memory"] = round((count(elements) - own) / n, 1)
        out[f"{fmt}_frame"] = count(section) - count(elements)
        out[f"{fmt}_sentence"] = count(sentence)
    out["body_median"] = statistics.median(count(m["text"]) for m in mems)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--memories", type=int, default=200)
    args = ap.parse_args()
    families = sorted(ctxcore.catalog.default_catalog().policies)
    rows = [measure(f, args.memories) for f in families]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        "| family | counted | compact, per memory | verbose, per memory | compact frame (sentence) | verbose frame (sentence) |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['family']} | {r['counted']} | {r['compact_per_memory']} | {r['verbose_per_memory']} | "
            f"{r['compact_frame']} ({r['compact_sentence']}) | {r['verbose_frame']} ({r['verbose_sentence']}) |"
        )
    print(
        f"\nmemories: {args.memories} conversational turns, median body {rows[0]['body_median']} tokens "
        f"({rows[0]['family']}); UUID store ids; verbose writes score and source, compact neither"
    )


if __name__ == "__main__":
    main()
