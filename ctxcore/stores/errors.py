"""The exceptions of the memory stores: bad ingest input, a store that cannot serve a
query as asked, and a memory service that answered with something other than the wire
format. Retrieval turns any of them into a branch ``error``; none of them ever carries a
partial result.
"""

from __future__ import annotations

__all__ = ["InvalidMemory", "MemoryServiceError", "MemoryStoreError"]


class MemoryStoreError(RuntimeError):
    """A store cannot do what was asked (a schema newer than this ctxcore, an embedding of
    the wrong dimension, a different embedder than the database was built with)."""

    __module__ = "ctxcore.stores"


class InvalidMemory(ValueError):
    """A memory or directive given for ingest is not valid; nothing of the batch is stored.

    Attributes:
        index: the position of the bad record in its batch (-1 when not in a batch).
        memory_id: the bad record's id, when it has a usable one.
    """

    __module__ = "ctxcore.stores"

    def __init__(self, message: str, index: int = -1, memory_id: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.memory_id = memory_id


class MemoryServiceError(RuntimeError):
    """A memory service request failed or its response is not the documented wire format
    (``docs/memory-service-wire.md``). The whole response is rejected.

    Attributes:
        status: the HTTP status, when a response arrived.
    """

    __module__ = "ctxcore.stores"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
