"""Pictures of gates and budgets, drawn with matplotlib (``pip install 'ctxcore-llm[bench]'``).

`plot_latency` draws, per measured stage, a histogram of the round latencies and a
percentile plot (latency against percentile on a "nines" axis, so the tail gets the room
it needs), with the gate bounds and the reference's median. `plot_budget` draws how one
assembly spent the model's window as a stacked bar: response reserve, safety buffer,
directive, messages, tools, formatting, memories, unused. Figures are built with
matplotlib's object API on the Agg canvas and never touch pyplot's global state or the
backend of the program that calls them; the file's suffix picks the format.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .gates import StageResult

__all__ = ["PLOT_FORMATS", "PlotError", "budget_segments", "check_plot_path", "plot_budget", "plot_latency"]

#: File suffixes a plot can be written as.
PLOT_FORMATS = (".png", ".svg", ".pdf")


class PlotError(ValueError):
    """A plot that cannot be drawn: matplotlib missing, or an unsupported file suffix."""


def check_plot_path(path: str | Path) -> None:
    """Refuse, before any work, a plot file that cannot be written: a suffix that is not a
    plot format, a directory that does not exist or is not writable, a directory in the
    file's place.

    >>> check_plot_path("budget.gif")
    Traceback (most recent call last):
    ...
    ctxcore.benchmarking.plots.PlotError: cannot write a plot as 'budget.gif': the file must end in .png, .svg, .pdf
    """
    p = Path(path)
    if p.suffix.lower() not in PLOT_FORMATS:
        raise PlotError(f"cannot write a plot as {p.name!r}: the file must end in {', '.join(PLOT_FORMATS)}")
    parent = p.parent
    if not parent.is_dir():
        raise PlotError(f"cannot write a plot to {p}: no directory {parent}")
    if p.is_dir():
        raise PlotError(f"cannot write a plot to {p}: it is a directory")
    if not os.access(p if p.exists() else parent, os.W_OK):
        raise PlotError(f"cannot write a plot to {p}: permission denied")


def new_figure(path: str | Path, width: float, height: float) -> tuple[Any, str]:
    suffix = Path(path).suffix.lower()
    if suffix not in PLOT_FORMATS:
        raise PlotError(f"cannot write a plot as {Path(path).name!r}: the file must end in {', '.join(PLOT_FORMATS)}")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError("plots need matplotlib: pip install 'ctxcore-llm[bench]'") from None
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, suffix[1:]


def save_figure(fig: Any, path: str | Path, fmt: str) -> Path:
    import matplotlib

    out = Path(path)
    # SVG text stays text (searchable, small) rather than glyph outlines.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(out, format=fmt, dpi=110, metadata={"Date": None} if fmt == "svg" else None)
    return out


#: Percentile ticks of the "nines" axis.
_NINES = (0.0, 50.0, 90.0, 99.0, 99.9)


def _nines(q: Any) -> Any:
    return -np.log10(1.0 - np.asarray(q) / 100.0)


def plot_latency(results: Sequence[StageResult], path: str | Path, *, title: str | None = None) -> Path:
    """Write a histogram and a percentile plot per stage to `path` (.png, .svg or .pdf).

    >>> import os, tempfile
    >>> from ctxcore.benchmarking.gates import LatencyStats, StageResult, evaluate, make_gates
    >>> t = np.full(200, 0.001); t[-2:] = 0.004
    >>> s = LatencyStats.from_seconds(t)
    >>> r = StageResult("pack", {}, s, evaluate(make_gates(p99_ms=10), s, None), t)
    >>> out = plot_latency([r], os.path.join(tempfile.mkdtemp(), "gate.png"))
    >>> out.stat().st_size > 0
    True
    """
    if not results:
        raise PlotError("nothing to plot: no stage was measured")
    fig, fmt = new_figure(path, 10.0, 3.0 * len(results) + 0.4)
    axes = fig.subplots(len(results), 2, squeeze=False)
    for (hist, pct), r in zip(axes, results):
        ms = np.sort(np.asarray(r.times, dtype=np.float64) * 1e3)
        st = r.stats
        bounds = {v.gate: v.bound for v in r.verdicts if v.unit == "ms"}
        verdict = "pass" if r.passed else "FAIL"
        name = r.workload.get("name") or r.workload.get("test") or ""
        hist.hist(ms, bins=min(60, max(10, ms.size // 5)), color="#4C72B0", edgecolor="white", linewidth=0.4)
        hist.axvline(st.p50_ms, color="#333333", linewidth=1.2, label=f"p50 {st.p50_ms:.3f} ms")
        hist.axvline(st.p99_ms, color="#DD8452", linewidth=1.2, label=f"p99 {st.p99_ms:.3f} ms")
        if "p99" in bounds and bounds["p99"] <= ms.max() * 1.5:
            hist.axvline(bounds["p99"], color="#C44E52", linestyle="--", label=f"p99 bound {bounds['p99']:g} ms")
        hist.set_xlabel("latency per call (ms)")
        hist.set_ylabel("rounds")
        hist.set_title(f"{r.stage} ({name}): {st.rounds} rounds, gates {verdict}", fontsize=10)
        hist.legend(fontsize=8, frameon=False)

        q = (np.arange(ms.size) + 0.5) / ms.size * 100.0
        pct.plot(_nines(q), ms, marker=".", markersize=3, linewidth=1.0, color="#4C72B0", label=r.stage)
        for name_, value, style in (
            ("p99 bound", bounds.get("p99"), "--"),
            ("median bound", bounds.get("median"), ":"),
        ):
            if value is not None:
                pct.axhline(value, color="#C44E52", linestyle=style, linewidth=1.0, label=f"{name_} {value:g} ms")
        if r.reference is not None:
            pct.axhline(
                r.reference.p50_ms,
                color="#55A868",
                linestyle="-.",
                linewidth=1.0,
                label=f"{r.reference_name} median {r.reference.p50_ms:.3f} ms",
            )
        ticks = [t for t in _NINES if t < q.max() + 1e-9] or [0.0]
        pct.set_xticks(_nines(ticks), [f"{t:g}%" for t in ticks])
        pct.set_yscale("log")
        from matplotlib.ticker import FormatStrFormatter

        pct.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        pct.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
        pct.tick_params(axis="y", which="minor", labelsize=7)
        pct.set_xlabel("percentile")
        pct.set_ylabel("latency (ms, log)")
        pct.set_title(
            f"p50 {st.p50_ms:.3f}  p90 {st.p90_ms:.3f}  p99 {st.p99_ms:.3f}  max {st.max_ms:.3f} ms", fontsize=10
        )
        pct.grid(True, which="major", alpha=0.3)
        pct.legend(fontsize=8, frameon=False, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=11)
    return save_figure(fig, path, fmt)


#: The budget's parts in the order the bar draws them.
_SEGMENTS = (
    ("response reserve", "response_reserve", "#8C8C8C"),
    ("safety buffer", "safety_buffer", "#B0B0B0"),
    ("directive", "directive_tokens", "#8172B3"),
    ("messages", "messages_tokens", "#4C72B0"),
    ("tools", "tool_schema_tokens", "#64B5CD"),
    ("formatting", "formatter_overhead_tokens", "#CCB974"),
)


def budget_segments(budget: Any, memory_tokens: int) -> list[tuple[str, int]]:
    """The window's parts in tokens: the budget's terms, the memories packed, and what
    is left unused (``usable - memories``); they add up to the window when it fits.

    >>> import ctxcore
    >>> b = ctxcore.compute_budget("gpt-4", directive_tokens=200)
    >>> [(k, v) for k, v in budget_segments(b, 1000) if v][-2:]
    [('memories', 1000), ('unused', 5722)]
    """
    parts = [(label, int(getattr(budget, attr))) for label, attr, _ in _SEGMENTS]
    parts.append(("memories", int(memory_tokens)))
    parts.append(("unused", max(0, int(budget.usable) - int(memory_tokens))))
    return parts


def plot_budget(ctx: Any, path: str | Path) -> Path:
    """Draw how one assembly (`ctxcore.AssembledContext`) spent the window, as a stacked
    bar, to `path` (.png, .svg or .pdf)."""
    budget = ctx.budget
    used = ctx.pack.tokens_used if ctx.pack is not None else 0
    parts = budget_segments(budget, used)
    colors = [c for _, _, c in _SEGMENTS] + ["#55A868", "#EAEAF2"]
    fig, fmt = new_figure(path, 10.0, 2.6)
    ax = fig.subplots()
    left = 0
    for (label, tokens), color in zip(parts, colors):
        ax.barh([0], [tokens], left=left, color=color, edgecolor="white", linewidth=0.6, label=f"{label}: {tokens:,}")
        if tokens >= 0.06 * budget.context_window:
            ax.text(left + tokens / 2, 0, f"{label}\n{tokens:,}", ha="center", va="center", fontsize=8)
        left += tokens
    ax.set_xlim(0, max(budget.context_window, left))
    ax.set_yticks([])
    ax.set_xlabel("tokens")
    sel = len(ctx.selected_ids)
    ax.set_title(
        f"{budget.model}: {budget.context_window:,}-token window ({budget.tokenizer_family}, "
        f"{budget.estimate_kind.value} counts); {sel} memories in {used:,} of {budget.usable:,} usable",
        fontsize=10,
    )
    ax.legend(ncol=4, fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    return save_figure(fig, path, fmt)
