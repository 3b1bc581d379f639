"""What the benchmarks and the load driver share: the questions they ask, and the corpus
their memory stores hold (the shipped multilingual demo texts, each with one word swapped
for a word of another memory and a reference number, over 100 scopes: 20 organizations
x 5 agents).

Imported by name: pyproject.toml puts bench/ on the pytest path, and ``python
bench/load_driver.py`` runs with bench/ first on ``sys.path``. Also the types of the
fixtures bench/conftest.py provides (`Timed`, `Store100k`), for the benchmarks'
annotations.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.resources import files
from typing import TYPE_CHECKING, Protocol

from ctxcore._files import jsonl_objects
from ctxcore.memory import Scope
from ctxcore.stores import DEMO_DATASET, NewMemory

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from ctxcore.stores import SqliteMemoryStore

__all__ = [
    "N_AGENTS",
    "N_ORGS",
    "QUESTIONS",
    "STORE_LARGE_SCOPE_MEMORIES",
    "STORE_MEMORIES",
    "Store100k",
    "Timed",
    "demo_texts",
    "memory_text",
    "scopes",
    "store_corpus",
]

N_ORGS, N_AGENTS = 20, 5
#: Memories in the benchmarks' store, and in its one large scope (a long-lived agent).
STORE_MEMORIES = 100_000
STORE_LARGE_SCOPE_MEMORIES = 10_000
#: The questions the benchmarks and the load driver ask, in seven languages.
QUESTIONS = [
    "A customer wants to return shoes bought three weeks ago and asks about the refund.",
    "Wann darf der Fahrer nach 4,5 Stunden Lenkzeit weiterfahren?",
    "Quelle est la politique d'annulation pour une réservation ?",
    "炊飯器のエラーE3の対処方法を教えてください",
    "退款多久可以到账？",
    "¿Cuánto tarda la instalación de paneles solares?",
    "Postgres replication lag is high, what is the runbook?",
    "Which customer prefers email and should not be called?",
]


def scopes() -> list[Scope]:
    """The 100 (organization, agent) pairs the bench stores hold."""
    return [Scope(f"org-{o:02d}", f"agent-{a}") for o in range(N_ORGS) for a in range(N_AGENTS)]


def demo_texts() -> list[str]:
    """The texts of the memories of the shipped demo dataset."""
    text = files("ctxcore").joinpath(DEMO_DATASET).read_text(encoding="utf-8")
    return [d["text"] for _, d in jsonl_objects(text, DEMO_DATASET, ValueError) if d.get("type", "memory") == "memory"]


def memory_text(rng: random.Random, texts: list[str]) -> str:
    """A demo text with one word swapped for a word of another, and a reference number."""
    words = rng.choice(texts).split(" ")
    if len(words) > 4:
        words[rng.randrange(len(words))] = rng.choice(rng.choice(texts).split(" "))
    return " ".join(words) + f" (ref {rng.randrange(10**6):06d})"


def store_corpus(large: Scope, n: int = STORE_MEMORIES) -> Iterator[NewMemory]:
    """The benchmarks' store: the first `STORE_LARGE_SCOPE_MEMORIES` memories in `large`,
    the rest spread over the other 99 scopes."""
    texts = demo_texts()
    rng = random.Random(2026)
    for i in range(n):
        text = memory_text(rng, texts)
        if i < STORE_LARGE_SCOPE_MEMORIES:
            scope = large
        else:
            k = rng.randrange(99) + 1
            scope = Scope(f"org-{k // 5:02d}", f"agent-{k % 5}")
        yield NewMemory(f"m{i:06d}", scope.organization_id, scope.agent_id, text, created_at=1.7e9 + i)


# ---- the types of bench/conftest.py's fixtures ------------------------------------------


class Timed(Protocol):
    """The ``timed`` fixture (`ctxcore.benchmarking.sample`): wall times in seconds of
    `rounds` calls of `fn`, after `warmup` untimed ones."""

    def __call__(self, fn: Callable[[], object], rounds: int, warmup: int = ...) -> npt.NDArray[np.float64]: ...


@dataclass(frozen=True)
class Store100k:
    """The ``store_100k`` fixture: the session's 100k-memory store, a scope holding
    10,000 of its memories (a long-lived agent) and a typical scope (~900)."""

    store: SqliteMemoryStore
    large: Scope
    typical: Scope
    size: int
