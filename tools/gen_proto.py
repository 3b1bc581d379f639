#!/usr/bin/env python3
"""Generate ctxcore/v1's Python code from ctxcore/v1/context_assembly.proto.

    python tools/gen_proto.py            # rewrite the committed files in the checkout
    python tools/gen_proto.py --check    # exit 1 when they are out of date

Runs grpcio-tools' protoc (messages, their .pyi types, the service stub) with the checkout
root as the import root, so generated imports read ``from ctxcore.v1 import ...`` and
resolve inside the package. The generated .pyi and _grpc modules are marked
``# mypy: ignore-errors``: they are not written to ``mypy --strict``'s standard, and the
marker keeps that true from any directory mypy is run in.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

PROTO = "ctxcore/v1/context_assembly.proto"
OUTPUTS = (
    "ctxcore/v1/context_assembly_pb2.py",
    "ctxcore/v1/context_assembly_pb2.pyi",
    "ctxcore/v1/context_assembly_pb2_grpc.py",
)
_MARK = "# mypy: ignore-errors\n"
_MARKED = ("ctxcore/v1/context_assembly_pb2.pyi", "ctxcore/v1/context_assembly_pb2_grpc.py")


def generate(proto_root: Path, out: Path) -> dict[str, str]:
    """Run protoc on ``proto_root/PROTO`` into `out`; return {relative path: text}."""
    # grpcio-tools ships no type hints (no py.typed marker, no stubs package); mypy reports
    # that at the module's first import.
    import grpc_tools  # type: ignore[import-untyped]
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{proto_root}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        str(proto_root / PROTO),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {PROTO}")
    texts: dict[str, str] = {}
    for rel in OUTPUTS:
        text = (out / rel).read_text(encoding="utf-8")
        texts[rel] = _MARK + text if rel in _MARKED else text
    return texts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        texts = generate(root, Path(tmp))
    stale = [
        rel
        for rel, text in texts.items()
        if not (root / rel).exists() or (root / rel).read_text(encoding="utf-8") != text
    ]
    if args.check:
        for rel in stale:
            print(f"{rel} is out of date: run python tools/gen_proto.py", file=sys.stderr)
        return 1 if stale else 0
    for rel in stale:
        (root / rel).write_text(texts[rel], encoding="utf-8")
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
