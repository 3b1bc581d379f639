#!/usr/bin/env python3
"""Write ctxcore/data/nonce_words.txt: the compact rendering's nonce alphabet.

The compact nonce is three decimal digits and four words of this list, separated by
spaces (10 + 4 x 14 = 66 random bits). Each word is lowercase ASCII, 2-12 letters, and is
a single token with its leading space in both cl100k_base and o200k_base, so the nonce
costs five tokens in either (a 20-digit nonce of the same entropy costs seven); the
estimator families measure cheaper too (docs/memory-wrapper-cost.md). The list holds the
2**14 such words that come first in cl100k_base's merge order (the most common ones).

    python tools/nonce_words.py            # rewrite the file
    python tools/nonce_words.py --check    # exit 1 if the file differs from what it would write
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ctxcore.tokens import _encoding as exact_encoding  # the tiktoken Encoding (a tool, not the package)

WORDS = 1 << 14
OUT = Path(__file__).resolve().parents[1] / "ctxcore" / "data" / "nonce_words.txt"
_WORD = re.compile(r" [a-z]{2,12}")


def _spaced_words(family: str) -> dict[str, int]:
    enc = exact_encoding(family)
    out: dict[str, int] = {}
    for rank in range(enc.n_vocab):
        try:
            piece = enc.decode_single_token_bytes(rank).decode("ascii")
        except (KeyError, UnicodeDecodeError):
            continue
        if _WORD.fullmatch(piece):
            out[piece[1:]] = rank
    return out


def words() -> list[str]:
    cl, o = _spaced_words("cl100k_base"), _spaced_words("o200k_base")
    both = sorted((w for w in cl if w in o), key=lambda w: cl[w])
    if len(both) < WORDS:
        raise SystemExit(f"only {len(both)} words are single tokens in both families, {WORDS} needed")
    return both[:WORDS]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    text = "\n".join(words()) + "\n"
    if args.check:
        if OUT.read_text(encoding="ascii") != text:
            print(f"{OUT} is stale: run python tools/nonce_words.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="ascii")
    print(f"wrote {WORDS} words to {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
