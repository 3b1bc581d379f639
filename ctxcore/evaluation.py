"""Evidence recall at equal spend: ctxcore's context against the baselines a user would
otherwise write, on the user's own store and labels (``ctxcore eval``).

A label is a query and the ids of the memories that answer it. For every label and every
spend (a token budget), each system fills a context and is charged for it in the
model's exact tokens:

- ``ctxcore``: `ctxcore.assemble` with its defaults and ``token_budget`` = the spend,
  charged the whole rendered memories section (wrapper, nonce, safety sentence and all);
- ``bm25``: Okapi BM25 over every memory of the scope (word tokens, lower case, an English
  stop list; ``bm25s``), best first;
- ``dense``: the store's own embedder alone, cosine, best first;
- ``rrf``: reciprocal-rank fusion of those two (k = 60);
- ``recency``: the newest memories first (what trim-to-budget chat memory keeps).

Each baseline takes its ranking best first, skipping a memory that no longer fits, and
pays the exact tokens of each memory's text plus one token per memory: a wrapper far
cheaper than any safe one. Evidence recall is the share of a label's evidence in the
context, averaged over labels; the all-evidence share is the share of labels whose
evidence is all in.

>>> Label.parse({"query": "tea?", "evidence": ["m1"]}, line=1, organization_id="o", agent_id="a").evidence
frozenset({'m1'})
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ._extras import require
from ._files import json_value
from ._numbers import as_int
from .errors import ConfigError, ContextOverflow
from .memory import MemoryBatch, Query, Scope, Sources
from .request import AssemblyOptions, AssemblyRequest
from .tokens import count_tokens

__all__ = [
    "BASELINES",
    "DEFAULT_EVAL_BUDGETS",
    "DEFAULT_EVAL_MODEL",
    "SYSTEMS",
    "EvalReport",
    "Label",
    "LabelError",
    "SystemScore",
    "evaluate",
    "plot_recall",
    "read_labels",
]

#: The baselines every evaluation runs beside ctxcore, in the order reported.
BASELINES = ("bm25", "dense", "rrf", "recency")
#: Every system an evaluation reports.
SYSTEMS = ("ctxcore", *BASELINES)
#: The spends (token budgets) evaluated when none are given.
DEFAULT_EVAL_BUDGETS = (1024, 2048, 4096)
#: The model whose tokens every system is charged in (cl100k_base, a 128k window).
DEFAULT_EVAL_MODEL = "gpt-4-turbo"
#: Reciprocal-rank fusion's constant for the ``rrf`` baseline (the customary value).
BASELINE_RRF_K = 60.0
#: What a baseline pays per memory beyond its text's tokens.
BASELINE_WRAPPER_TOKENS = 1


class LabelError(ValueError):
    """A labels file that cannot be evaluated: unreadable, not JSON Lines, or a line
    without a query or evidence ids (the message names the file and the line)."""


@dataclass(frozen=True, slots=True)
class Label:
    """One evaluation question: the query, the ids of the memories that answer it, and
    the scope it is asked in."""

    query: str
    evidence: frozenset[str]
    organization_id: str
    agent_id: str
    id: str | None = None

    @property
    def scope(self) -> Scope:
        return Scope(self.organization_id, self.agent_id)

    @classmethod
    def parse(cls, doc: object, *, line: int, organization_id: str | None = None, agent_id: str | None = None) -> Label:
        """A label from one JSON object: ``query`` (str), ``evidence`` (a non-empty list of
        memory ids), and optionally ``organization_id``, ``agent_id`` (else the defaults
        given) and ``id``."""
        if not isinstance(doc, Mapping):
            raise LabelError(f"line {line}: a label must be a JSON object, got {type(doc).__name__}")
        unknown = set(doc) - {"query", "evidence", "organization_id", "agent_id", "id"}
        if unknown:
            raise LabelError(
                f"line {line}: unknown keys {sorted(unknown)} (a label has query, evidence, "
                "organization_id, agent_id, id)"
            )
        query = doc.get("query")
        if not isinstance(query, str) or not query.strip():
            raise LabelError(f"line {line}: query must be a non-empty string, got {query!r:.60}")
        evidence = doc.get("evidence")
        if not isinstance(evidence, list) or not evidence or not all(isinstance(e, str) and e for e in evidence):
            raise LabelError(f"line {line}: evidence must be a non-empty list of memory ids, got {evidence!r:.60}")
        org = doc.get("organization_id", organization_id)
        agent = doc.get("agent_id", agent_id)
        for name, value in (("organization_id", org), ("agent_id", agent)):
            if not isinstance(value, str) or not value:
                raise LabelError(
                    f"line {line}: {name} must be a non-empty string (in the label or given "
                    f"as the default), got {value!r:.60}"
                )
        ident = doc.get("id")
        if ident is not None and not isinstance(ident, str):
            raise LabelError(f"line {line}: id must be a string, got {ident!r:.60}")
        return cls(query, frozenset(evidence), str(org), str(agent), ident)


def read_labels(
    path: str | Path, *, text: str | None = None, organization_id: str | None = None, agent_id: str | None = None
) -> list[Label]:
    """The labels of a JSON Lines file (blank lines skipped); `LabelError` names the first
    bad line. `text`, when given, is parsed instead of reading `path` (which then only
    names the source in messages, e.g. ``<stdin>``)."""
    p = Path(path)
    try:
        # Lines end at "\n" alone: U+2028, U+2029 or U+0085 inside a query are text.
        lines = (p.read_text(encoding="utf-8") if text is None else text).split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise LabelError(f"cannot read labels from {p}: {exc}") from None
    out = []
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        doc = json_value(raw, f"{p}: line {i}", LabelError)
        try:
            out.append(Label.parse(doc, line=i, organization_id=organization_id, agent_id=agent_id))
        except LabelError as exc:
            raise LabelError(f"{p}: {exc}") from None
    if not out:
        raise LabelError(f"{p}: no labels")
    return out


@dataclass(frozen=True, slots=True)
class SystemScore:
    """One system at one spend, averaged over the labels."""

    system: str
    budget: int
    recall: float  #: mean share of a label's evidence in the context
    all_evidence: float  #: share of labels whose evidence is all in the context
    spent: float  #: mean tokens charged
    selected: float  #: mean memories in the context


@dataclass(frozen=True)
class EvalReport:
    """What `evaluate` measured: one `SystemScore` per system and spend."""

    model: str
    family: str
    budgets: tuple[int, ...]
    labels: int
    scores: tuple[SystemScore, ...]
    embedder: str | None
    #: ctxcore assemblies that degraded (a branch late or failed), of labels x budgets.
    degraded: int = 0
    #: Evidence ids no memory of their scope has (counted as missed by every system).
    missing_evidence: int = 0
    ctxcore_p50_ms: float = 0.0
    ctxcore_p99_ms: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def score(self, system: str, budget: int) -> SystemScore:
        for s in self.scores:
            if s.system == system and s.budget == budget:
                return s
        raise KeyError(f"no score for {system!r} at {budget}")

    def best_baseline(self, budget: int) -> SystemScore:
        """The baseline with the highest recall at `budget`."""
        return max((s for s in self.scores if s.budget == budget and s.system != "ctxcore"), key=lambda s: s.recall)

    def record(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "model": self.model,
            "family": self.family,
            "budgets": list(self.budgets),
            "labels": self.labels,
            "embedder": self.embedder,
            "degraded": self.degraded,
            "missing_evidence": self.missing_evidence,
            "ctxcore_ms": {"p50": round(self.ctxcore_p50_ms, 3), "p99": round(self.ctxcore_p99_ms, 3)},
            "scores": [
                {
                    "system": s.system,
                    "budget": s.budget,
                    "recall": round(s.recall, 4),
                    "all_evidence": round(s.all_evidence, 4),
                    "spent": round(s.spent, 1),
                    "selected": round(s.selected, 2),
                }
                for s in self.scores
            ],
            "ratio_to_best_baseline": {
                str(b): round(self.score("ctxcore", b).recall / max(self.best_baseline(b).recall, 1e-12), 4)
                for b in self.budgets
            },
        }

    def table(self) -> str:
        """A plain-text table: recall (all-evidence share) per system and spend."""
        systems = [s for s in SYSTEMS if any(x.system == s for x in self.scores)]
        head = ["system", *(f"{b} tokens" for b in self.budgets)]
        rows = [head]
        for name in systems:
            row = [name]
            for b in self.budgets:
                s = self.score(name, b)
                row.append(f"{s.recall:.3f} ({s.all_evidence:.2f})")
            rows.append(row)
        rows.append(
            ["ctxcore / best"]
            + [
                f"{self.score('ctxcore', b).recall / max(self.best_baseline(b).recall, 1e-12):.2f}x"
                for b in self.budgets
            ]
        )
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        foot = (
            f"evidence recall (all-evidence share) over {self.labels} labels, charged in {self.family} "
            f"tokens ({self.model}); embedder: {self.embedder or 'none'}; ctxcore assembly p50 "
            f"{self.ctxcore_p50_ms:.1f} ms, p99 {self.ctxcore_p99_ms:.1f} ms, degraded {self.degraded}"
        )
        if self.missing_evidence:
            foot += f"; {self.missing_evidence} evidence ids are not in the store"
        return "\n".join([*lines, foot])


# ---- the baselines -----------------------------------------------------------------------


@dataclass
class _ScopeIndex:
    """One scope's memories with what the baselines rank them by."""

    ids: list[str]
    texts: list[str]
    created_at: npt.NDArray[np.float64]
    cost: npt.NDArray[np.int64]
    bm25: Any
    vectors: npt.NDArray[np.float32] | None
    position: dict[str, int]


def _tokenize(texts: Sequence[str]) -> Any:
    import bm25s  # type: ignore[import-untyped,unused-ignore]

    return bm25s.tokenize(list(texts), stopwords="en", show_progress=False, return_ids=False)


def _scope_index(batch: MemoryBatch, embedder: Any, family: str) -> _ScopeIndex:
    import bm25s  # type: ignore[import-untyped,unused-ignore]

    from .stores.embedders import embed_many

    texts = list(batch.texts)
    ids = list(batch.ids)
    bm = bm25s.BM25()
    if texts:
        bm.index(_tokenize(texts), show_progress=False)
    vectors = None
    if embedder is not None and texts:
        vs = embed_many(embedder, texts)
        dim = next((v.shape[0] for v in vs if v is not None), 0)
        mat = np.zeros((len(vs), dim), dtype=np.float32)
        for i, v in enumerate(vs):
            if v is not None:
                n = float(np.linalg.norm(v))
                mat[i] = v / n if n > 0 else v
        vectors = mat
    cost = np.array([count_tokens(t, family).value + BASELINE_WRAPPER_TOKENS for t in texts], dtype=np.int64)
    created = np.nan_to_num(np.asarray(batch.created_at, dtype=np.float64), nan=-math.inf)
    return _ScopeIndex(ids, texts, created, cost, bm, vectors, {m: i for i, m in enumerate(ids)})


def _bm25_scores(index: _ScopeIndex, query: str) -> npt.NDArray[np.float64]:
    if not index.texts:
        return np.zeros(0)
    terms = _tokenize([query])[0]
    if not terms:
        return np.zeros(len(index.texts))
    return np.asarray(index.bm25.get_scores(terms), dtype=np.float64)


def _rankings(index: _ScopeIndex, query: str, embedder: Any) -> dict[str, npt.NDArray[np.int64]]:
    """Each baseline's ranking of the scope's memories (positions, best first)."""
    n = len(index.texts)
    out: dict[str, npt.NDArray[np.int64]] = {}
    bm = _bm25_scores(index, query)
    matched = np.flatnonzero(bm > 0)
    # Ties: the newer memory first, then the later position (both deterministic).
    out["bm25"] = matched[np.lexsort((-matched, -index.created_at[matched], -bm[matched]))]
    if embedder is not None:
        # Every label gets a dense and a fused ranking when the store has an embedder, so
        # each system is averaged over the same labels: a query without direction (or a
        # scope whose memories have none) is 0 to every memory, an empty scope ranks nothing.
        from .stores.embedders import embed_many

        cos = np.zeros(n, dtype=np.float32)
        if index.vectors is not None and n:
            (qv,) = embed_many(embedder, [query])
            if qv is not None and index.vectors.shape[1] == qv.shape[0]:
                q = qv / max(float(np.linalg.norm(qv)), 1e-12)
                cos = index.vectors @ q.astype(np.float32)
        pos = np.arange(n)
        out["dense"] = pos[np.lexsort((-pos, -index.created_at, -cos))]
        fused = np.zeros(n)
        for ranking in (out["bm25"], out["dense"]):
            fused[ranking] += 1.0 / (BASELINE_RRF_K + 1.0 + np.arange(ranking.shape[0]))
        cand = np.flatnonzero(fused > 0)
        out["rrf"] = cand[np.lexsort((-cand, -index.created_at[cand], -fused[cand]))]
    pos = np.arange(n)
    out["recency"] = pos[np.lexsort((-pos, -index.created_at))]
    return out


def _fill(ranking: npt.NDArray[np.int64], cost: npt.NDArray[np.int64], budget: int) -> list[int]:
    """The ranking's memories best first, each one that still fits, within `budget`."""
    left = budget
    out = []
    for i in ranking.tolist():
        c = int(cost[i])
        if c <= left:
            out.append(i)
            left -= c
            if left < 1 + BASELINE_WRAPPER_TOKENS:
                break
    return out


# ---- the evaluation ----------------------------------------------------------------------


async def evaluate(
    store: Any,
    labels: Sequence[Label],
    *,
    budgets: Iterable[int] = DEFAULT_EVAL_BUDGETS,
    model: str = DEFAULT_EVAL_MODEL,
    options: AssemblyOptions | None = None,
    config: Any = None,
) -> EvalReport:
    """Evidence recall per spend of ctxcore and the baselines on `store` (a store with
    ``memories(scope)``, e.g. `ctxcore.stores.SqliteMemoryStore`) for `labels`.

    ctxcore runs `ctxcore.assemble` per label and spend with ``token_budget`` = the spend,
    the store's hot and cold branches (no directive: only memories are compared) and
    `options` (its defaults when None); `config` is passed to assemble. Each system is
    charged in the exact tokens of `model`'s tokenizer family. The report's budgets are
    the distinct spends given, smallest first (as ``ctxcore eval --budget`` reads them).

    Raises:
        ConfigError: no budgets, a budget that is not a positive integer (of any integer
            type), or a store that cannot list a scope's memories.
        LabelError: no labels.
        TypeError: a label that is not a `Label` (its index is named).
    """
    from .assembly import assemble
    from .catalog import default_catalog

    require("eval", "ctxcore.evaluation")
    given = list(budgets)
    whole = [as_int(b) for b in given]
    if not given or any(b is None or b <= 0 for b in whole):
        raise ConfigError(f"budgets must be positive ints, got {given!r:.80}")
    spends = tuple(sorted({b for b in whole if b is not None}))
    if not labels:
        raise LabelError("no labels to evaluate")
    for i, label in enumerate(labels):
        if not isinstance(label, Label):
            raise TypeError(
                f"labels[{i}] must be a Label (ctxcore.evaluation.read_labels or Label.parse make them), "
                f"got {type(label).__name__}"
            )
    scan = getattr(store, "memories", None)
    if not callable(scan):
        raise ConfigError(
            f"{type(store).__name__} cannot list a scope's memories (memories(scope)); "
            "ctxcore eval needs a store that can"
        )
    family = default_catalog().get_model(model).tokenizer_family
    embedder = getattr(store, "embedder", None)
    opts = options if options is not None else AssemblyOptions()
    full = Sources.from_store(store)
    sources = Sources(directive=None, hot=full.hot, cold=full.cold)
    indexes: dict[Scope, _ScopeIndex] = {}
    for label in labels:
        if label.scope not in indexes:
            warm = getattr(store, "warm", None)
            if callable(warm):
                warm([label.scope])
            indexes[label.scope] = _scope_index(scan(label.scope), embedder, family)
    found: dict[tuple[str, int], list[float]] = {}
    complete: dict[tuple[str, int], list[float]] = {}
    spent: dict[tuple[str, int], list[float]] = {}
    counts: dict[tuple[str, int], list[float]] = {}

    def note(system: str, budget: int, evidence: frozenset[str], chosen: Iterable[str], tokens: int) -> None:
        got = evidence.intersection(chosen)
        key = (system, budget)
        found.setdefault(key, []).append(len(got) / len(evidence))
        complete.setdefault(key, []).append(1.0 if len(got) == len(evidence) else 0.0)
        spent.setdefault(key, []).append(float(tokens))
        counts.setdefault(key, []).append(float(len(set(chosen))))

    degraded = 0
    missing = 0
    latencies: list[float] = []
    for label in labels:
        index = indexes[label.scope]
        missing += sum(1 for e in label.evidence if e not in index.position)
        rankings = _rankings(index, label.query, embedder)
        for budget in spends:
            req = AssemblyRequest(
                label.organization_id, label.agent_id, model, Query(label.query), options=opts, token_budget=budget
            )
            t0 = time.perf_counter()
            try:
                ctx = await assemble(req, sources=sources, config=config)
            except ContextOverflow:
                # The spend does not cover the memories section's fixed text: nothing fits.
                note("ctxcore", budget, label.evidence, (), 0)
            else:
                degraded += bool(ctx.degraded)
                section = ctx.sections.get("memories", "")
                note(
                    "ctxcore",
                    budget,
                    label.evidence,
                    ctx.selected_ids,
                    count_tokens(section, family).value if section else 0,
                )
            latencies.append((time.perf_counter() - t0) * 1000.0)
            for name in BASELINES:
                ranking = rankings.get(name)
                if ranking is None:
                    continue
                picked = _fill(ranking, index.cost, budget)
                note(
                    name,
                    budget,
                    label.evidence,
                    [index.ids[i] for i in picked],
                    int(index.cost[picked].sum()) if picked else 0,
                )
    scores = tuple(
        SystemScore(
            system,
            b,
            float(np.mean(found[(system, b)])),
            float(np.mean(complete[(system, b)])),
            float(np.mean(spent[(system, b)])),
            float(np.mean(counts[(system, b)])),
        )
        for system in SYSTEMS
        for b in spends
        if (system, b) in found
    )
    lat = np.asarray(latencies)
    return EvalReport(
        model=model,
        family=family,
        budgets=spends,
        labels=len(labels),
        scores=scores,
        embedder=None if embedder is None else str(getattr(embedder, "name", type(embedder).__name__)),
        degraded=degraded,
        missing_evidence=missing,
        ctxcore_p50_ms=float(np.percentile(lat, 50)),
        ctxcore_p99_ms=float(np.percentile(lat, 99)),
    )


def evaluate_sync(store: Any, labels: Sequence[Label], **kw: Any) -> EvalReport:
    """`evaluate` from synchronous code (runs its own event loop)."""
    return asyncio.run(evaluate(store, labels, **kw))


def plot_recall(report: EvalReport, path: str | Path) -> Path:
    """Draw evidence recall against spend, one line per system, to `path` (.png, .svg
    or .pdf; matplotlib)."""
    from .benchmarking.plots import new_figure, save_figure

    fig, fmt = new_figure(path, 6.4, 4.2)
    ax = fig.add_subplot(1, 1, 1)
    for system in SYSTEMS:
        pts = [(s.budget, s.recall) for s in report.scores if s.system == system]
        if not pts:
            continue
        xs, ys = zip(*sorted(pts))
        ax.plot(xs, ys, marker="o", linewidth=2.4 if system == "ctxcore" else 1.2, label=system)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(report.budgets), [str(b) for b in report.budgets])
    ax.set_xlabel(f"spend ({report.family} tokens)")
    ax.set_ylabel("evidence recall")
    ax.set_ylim(0, 1)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"evidence recall at equal spend ({report.labels} labels)")
    return save_figure(fig, path, fmt)
