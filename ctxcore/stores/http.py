"""A client for a remote memory service: the retrieval branches over HTTP.

`HttpMemorySource` implements `ctxcore.memory.MemoryStore` against a service that speaks
the JSON wire of ``docs/memory-service-wire.md``: ``GET /v1/directive`` for the
directive, ``POST /v1/retrieve`` with ``branch`` ``"hot"`` or ``"cold"`` for memories.
One pooled ``httpx.AsyncClient`` serves all requests. The caller's cancellation (the
branch timeout of an assembly) stops a request at once; a per-request timeout bounds it
otherwise. A response is taken whole or not at all: an HTTP error, bad JSON, a missing
field, a wrong type, a non-finite number or more memories than asked for raises
`MemoryServiceError`, never a partial result. Memories of another scope are returned as
they came, well-formed, for the retrieval layer to count and drop.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from ..memory import (
    MemoryOrigin,
    MemoryRecord,
    Query,
    Scope,
    check_limit,
    check_min_similarity,
    check_query,
    check_scope,
)
from ..retrieval import DEFAULT_CLIENT_TIMEOUT_MS
from .errors import MemoryServiceError

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_REQUEST_TIMEOUT",
    "MAX_RESPONSE_BYTES",
    "HttpMemorySource",
    "parse_memories",
]

#: Per-request timeout (seconds): the design's 45 ms client timeout, the longest any
#: assembly waits for retrieval, so no request outlives the assembly that made it.
DEFAULT_REQUEST_TIMEOUT = DEFAULT_CLIENT_TIMEOUT_MS / 1000
#: Pooled connections to the service; three branches per assembly, a few assemblies in
#: flight.
DEFAULT_MAX_CONNECTIONS = 32
#: Largest response body read (bytes); a bigger one is rejected, not buffered.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024

_TOKEN_KINDS = ("exact", "estimate")


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name}")


def _check_base_url(base_url: object) -> None:
    """Raise ValueError unless `base_url` is an http:// or https:// URL naming a host (and
    a port in 1-65535, if any).

    >>> _check_base_url("http://")
    Traceback (most recent call last):
    ...
    ValueError: base_url must be an http:// or https:// URL with a host, got 'http://'
    """
    if not isinstance(base_url, str):
        raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r:.80}")
    try:
        url = httpx.URL(base_url)
        port = url.port
    except httpx.InvalidURL as exc:
        raise ValueError(f"base_url is not a valid URL ({exc}): {_shown_url(base_url)!r:.80}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"base_url must be an http:// or https:// URL with a host, got {_shown_url(base_url)!r:.80}")
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"base_url's port must be in 1-65535, got {port} in {_shown_url(base_url)!r:.80}")


def _shown_url(base_url: str) -> str:
    """`base_url` as reprs and error messages show it: a password in its user info
    replaced by ``***``.

    >>> _shown_url("https://svc:s3cret@memory.internal/api")
    'https://svc:***@memory.internal/api'
    """
    scheme, _, rest = base_url.partition("://")
    end = next((i for i, c in enumerate(rest) if c in "/?#"), len(rest))
    userinfo, at, host = rest[:end].rpartition("@")
    if not at or ":" not in userinfo:
        return base_url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}{rest[end:]}"


class HttpMemorySource:
    """A memory service over HTTP, as a `MemoryStore`.

    Args:
        base_url: the service's root, e.g. ``"http://memory.internal:8080"``.
        timeout: seconds per request, from the wait for a connection to the last byte of
            the answer, or None for no limit beyond the caller's cancellation.
        headers: sent with every request (e.g. ``{"Authorization": "Bearer ..."}``).
        max_connections: size of the connection pool.
        transport: an httpx transport (tests, proxies); None for the default.

    Use ``async with`` (or `aclose`) to release the pool.

    >>> import asyncio, httpx
    >>> def service(request: httpx.Request) -> httpx.Response:
    ...     return httpx.Response(200, json={"memories": [{"id": "m1", "content": "likes tea",
    ...         "similarity": 0.9, "confidence": 1.0, "rank": 0, "organization_id": "o", "agent_id": "a"}]})
    >>> async def main() -> list[str]:
    ...     async with HttpMemorySource("http://memory.test", transport=httpx.MockTransport(service)) as src:
    ...         return [r.text for r in await src.cold(Scope("o", "a"), Query("tea"), 5, 0.7)]
    >>> asyncio.run(main())
    ['likes tea']
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        _check_base_url(base_url)
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (0 < timeout < math.inf)
        ):
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
        self._base_url = base_url.rstrip("/")
        self._shown = _shown_url(self._base_url)
        self._timeout = timeout
        self._client = httpx.AsyncClient(
            base_url=self._base_url,
            timeout=httpx.Timeout(timeout),
            headers=dict(headers or {}),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
            follow_redirects=False,
        )

    @property
    def base_url(self) -> str:
        """The service's root URL."""
        return self._base_url

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    async def __aenter__(self) -> HttpMemorySource:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"HttpMemorySource({self._shown!r}, timeout={self._timeout!r})"

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        # httpx's timeout bounds each connect, read and write; the request as a whole (a
        # server that drips its answer a byte at a time) is bounded here.
        where = f"{method} {self._shown}{path}"
        try:
            async with asyncio.timeout(self._timeout):
                body = await self._exchange(where, method, path, **kwargs)
        except TimeoutError:
            raise MemoryServiceError(f"{where}: timed out: no complete response within {self._timeout} s") from None
        try:
            return json.loads(bytes(body), parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise MemoryServiceError(f"{where}: response is not valid JSON: {exc}", 200) from None

    async def _exchange(self, where: str, method: str, path: str, **kwargs: Any) -> bytearray:
        try:
            async with self._client.stream(method, path, **kwargs) as response:
                if response.status_code != 200:
                    raise MemoryServiceError(
                        f"{where}: HTTP {response.status_code} {response.reason_phrase}", response.status_code
                    )
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_RESPONSE_BYTES:
                        raise MemoryServiceError(
                            f"{where}: response larger than {MAX_RESPONSE_BYTES} bytes", response.status_code
                        )
        except httpx.TimeoutException as exc:
            raise MemoryServiceError(f"{where}: timed out after {self._timeout} s ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise MemoryServiceError(f"{where}: {type(exc).__name__}: {exc}") from exc
        return body

    async def directive(self, scope: Scope) -> str | None:
        """``GET /v1/directive``: the directive of `scope`, or None."""
        check_scope(scope)
        doc = await self._request(
            "GET", "/v1/directive", params={"organization_id": scope.organization_id, "agent_id": scope.agent_id}
        )
        if not isinstance(doc, dict) or "directive" not in doc:
            raise MemoryServiceError('directive response must be a JSON object with a "directive" field', 200)
        value = doc["directive"]
        if value is not None and not isinstance(value, str):
            raise MemoryServiceError(f'"directive" must be a string or null, got {type(value).__name__}', 200)
        return value

    async def hot(self, scope: Scope, query: Query, limit: int) -> Sequence[MemoryRecord]:
        """``POST /v1/retrieve`` with ``branch: "hot"``."""
        return await self._retrieve("hot", scope, query, limit, None)

    async def cold(self, scope: Scope, query: Query, limit: int, min_similarity: float) -> Sequence[MemoryRecord]:
        """``POST /v1/retrieve`` with ``branch: "cold"`` and the ANN cutoff."""
        min_similarity = check_min_similarity(min_similarity)
        return await self._retrieve("cold", scope, query, limit, min_similarity)

    async def _retrieve(
        self, branch: str, scope: Scope, query: Query, limit: int, min_similarity: float | None
    ) -> list[MemoryRecord]:
        check_scope(scope)
        check_query(query)
        check_limit(limit)
        q: dict[str, Any] = {"text": query.text}
        if query.embedding is not None:
            q["embedding"] = list(query.embedding)
        payload: dict[str, Any] = {
            "organization_id": scope.organization_id,
            "agent_id": scope.agent_id,
            "branch": branch,
            "query": q,
            "limit": limit,
        }
        if min_similarity is not None:
            payload["min_similarity"] = min_similarity
        doc = await self._request("POST", "/v1/retrieve", json=payload)
        return parse_memories(doc, limit)


def parse_memories(doc: object, limit: int) -> list[MemoryRecord]:
    """Validate a ``/v1/retrieve`` response body (already JSON-decoded) and convert it.

    Raises:
        MemoryServiceError: naming the first field that breaks the wire format.

    >>> parse_memories({"memories": [{"id": "m1", "content": "likes tea", "similarity": 0.8,
    ...     "confidence": 0.9, "rank": 0, "organization_id": "o", "agent_id": "a"}]}, 5)[0].similarity
    0.8
    >>> parse_memories({"memories": [{"id": "m1"}]}, 5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ctxcore.stores.MemoryServiceError: memories[0] ('m1'): missing field 'content'
    """
    if not isinstance(doc, dict) or "memories" not in doc:
        raise MemoryServiceError('retrieve response must be a JSON object with a "memories" field', 200)
    items = doc["memories"]
    if not isinstance(items, list):
        raise MemoryServiceError(f'"memories" must be an array, got {type(items).__name__}', 200)
    if len(items) > limit:
        raise MemoryServiceError(f"the service returned {len(items)} memories for a limit of {limit}", 200)
    return [_memory(item, k) for k, item in enumerate(items)]


def _memory(item: object, k: int) -> MemoryRecord:
    if not isinstance(item, dict):
        raise MemoryServiceError(f"memories[{k}] must be an object, got {type(item).__name__}", 200)
    label = f"memories[{k}]" + (f" ({item['id']!r})" if isinstance(item.get("id"), str) else "")

    def fail(msg: str) -> MemoryServiceError:
        return MemoryServiceError(f"{label}: {msg}", 200)

    for name in ("id", "content", "similarity", "confidence", "rank", "organization_id", "agent_id"):
        if name not in item:
            raise fail(f"missing field {name!r}")
    for name in ("id", "organization_id", "agent_id"):
        if not isinstance(item[name], str) or not item[name]:
            raise fail(f"{name} must be a non-empty string, got {item[name]!r:.60}")
    if not isinstance(item["content"], str):
        raise fail(f"content must be a string, got {type(item['content']).__name__}")

    def number(name: str, lo: float, hi: float, optional: bool) -> float | None:
        v = item.get(name)
        if v is None and optional:
            return None
        x = math.nan
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            try:
                x = float(v)
            except OverflowError:  # an integer beyond any float: it overflows to infinity
                x = math.inf
        if not math.isfinite(x) or not lo <= x <= hi:
            raise fail(
                f"{name} must be a finite number in [{lo:g}, {hi:g}]{' or null' if optional else ''}, got {v!r:.60}"
            )
        return x

    similarity = number("similarity", -1.0, 1.0, True)
    confidence = number("confidence", 0.0, 1.0, False)
    importance = number("importance", 0.0, 1.0, True)
    created_at = number("created_at", 0.0, math.inf, True)
    accessed_at = number("accessed_at", 0.0, math.inf, True)
    rank = item["rank"]
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise fail(f"rank must be an integer >= 0, got {rank!r:.60}")
    tok = [item.get(n) for n in ("token_count", "token_family", "token_kind")]
    if any(v is not None for v in tok):
        count, family, kind = tok
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise fail(f"token_count must be an integer >= 0, got {count!r:.60}")
        if not isinstance(family, str) or not family:
            raise fail(f"token_family must be a non-empty string with token_count, got {family!r:.60}")
        if kind not in _TOKEN_KINDS:
            raise fail(f"token_kind must be 'exact' or 'estimate' with token_count, got {kind!r:.60}")
    exact = item.get("exact_tokens")
    if exact is not None:
        if not isinstance(exact, dict):
            raise fail(f"exact_tokens must be an object of family -> count, got {type(exact).__name__}")
        for fam, n in exact.items():
            if not fam or isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise fail(f"exact_tokens[{fam!r:.40}] must be an integer >= 0, got {n!r:.60}")
    assert confidence is not None  # not optional
    try:
        return _record(item, similarity, confidence, importance, created_at, accessed_at, rank, tok, exact)
    except (TypeError, ValueError) as exc:  # MemoryRecord's own checks, should ours miss one
        # The label already names the memory: not twice.
        raise fail(str(exc).removeprefix(f"memory {item['id']!r}: ")) from None


def _record(
    item: dict[str, Any],
    similarity: float | None,
    confidence: float,
    importance: float | None,
    created_at: float | None,
    accessed_at: float | None,
    rank: int,
    tok: list[Any],
    exact: dict[str, int] | None = None,
) -> MemoryRecord:
    return MemoryRecord(
        id=item["id"],
        organization_id=item["organization_id"],
        agent_id=item["agent_id"],
        text=item["content"],
        origin=MemoryOrigin.REMOTE,
        similarity=similarity,
        confidence=confidence,
        importance=importance,
        created_at=created_at,
        accessed_at=accessed_at,
        rank=rank,
        token_count=tok[0],
        token_family=tok[1],
        token_kind=tok[2],
        exact_tokens=exact,
    )
