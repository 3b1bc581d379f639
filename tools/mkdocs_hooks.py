"""MkDocs hooks for the ctxcore site (no network, nothing fetched at build time).

- Doctest lines in docstrings (``>>> ...`` and their output, up to a blank line) are
  rendered as ``pycon`` code blocks, so their brackets are never read as Markdown links.
- Snippets (``--8<--``) resolve from the repository root, whatever the working directory,
  and a missing file fails the build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor

ROOT = Path(__file__).resolve().parent.parent  # tools/ -> the repository root


class _Doctests(Preprocessor):
    """Fence runs of doctest lines that are not inside a fenced block already."""

    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        fenced = False
        indent: str | None = None
        for line in lines:
            stripped = line.lstrip()
            if indent is None and stripped.startswith(("```", "~~~")):
                fenced = not fenced
            if not fenced and indent is None and stripped.startswith(">>>"):
                indent = line[: len(line) - len(stripped)]
                out.extend(["", indent + "```pycon"])
            elif indent is not None and not stripped:
                out.extend([indent + "```", ""])
                indent = None
            out.append(line)
        if indent is not None:
            out.append(indent + "```")
        return out


class DoctestExtension(Extension):
    def extendMarkdown(self, md: Markdown) -> None:
        # Before the fenced-code preprocessors (priority 25-30), so the fences it adds are read.
        md.preprocessors.register(_Doctests(md), "ctxcore_doctests", 40)


def on_config(config: Any) -> Any:
    config.markdown_extensions.append(DoctestExtension())
    snippets = config.mdx_configs.setdefault("pymdownx.snippets", {})
    snippets["base_path"] = [str(ROOT)]
    snippets["check_paths"] = True
    return config
