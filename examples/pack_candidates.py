"""Pack the candidates of examples/candidates.jsonl into a token budget and print the decisions.

pip install ctxcore-llm; python examples/pack_candidates.py [BUDGET] packs the file beside
this script (one {"id", "tokens", "score", "pinned"?} object per line) with ctxcore.pack and
prints what was selected, what was left out and why. `ctxcore pack examples/candidates.jsonl
--budget 800` does the same from the command line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ctxcore

CANDIDATES = Path(__file__).with_name("candidates.jsonl")


def main(budget: int = 800) -> ctxcore.PackResult:
    rows = [json.loads(line) for line in CANDIDATES.read_text(encoding="utf-8").splitlines() if line.strip()]
    candidates = [ctxcore.Candidate(r["id"], r["tokens"], r["score"], pinned=r.get("pinned", False)) for r in rows]
    return ctxcore.pack(candidates, budget)


if __name__ == "__main__":
    budget = int(sys.argv[1]) if len(sys.argv) > 1 else 800
    res = main(budget)
    print(
        f"{len(res.ids)} of {res.evaluated} candidates selected, {res.tokens_used} of {budget} tokens, "
        f"score {res.total_score:.3f} (bound {res.upper_bound:.3f}), path {res.path}"
    )
    for d in res.decisions:
        print(f"  {d.id:<28} {d.reason}")
