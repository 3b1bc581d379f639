"""`ctxcore.stores.HttpMemorySource` against a real HTTP server on loopback: the wire
format both ways, every malformed-response case, HTTP errors, and timeouts."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxcore
from ctxcore.memory import MemoryOrigin, MemoryStore, Query, Scope
from ctxcore.stores import HttpMemorySource, MemoryServiceError
from ctxcore.stores.http import MAX_RESPONSE_BYTES, parse_memories

# Deadlines roomy enough that a loaded machine cannot cancel a branch these tests read.
ROOMY = ctxcore.AssemblyConfig(
    client_timeout_ms=5000,
    server_deadline_ms=5000,
    directive_timeout_ms=5000,
    hot_timeout_ms=5000,
    cold_timeout_ms=5000,
)

SCOPE = Scope("acme", "support")


class Server:
    """A loopback HTTP server whose answer each test sets: (status, body bytes, delay)."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b"{}"
        self.delay = 0.0
        self.drip = 0.0  # seconds between the body's bytes
        self.requests: list[tuple[str, str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, payload: Any) -> None:
                outer.requests.append((self.command, self.path, payload))
                time.sleep(outer.delay)
                try:
                    self.send_response(outer.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(outer.body)))
                    self.end_headers()
                    if outer.drip:
                        for k in range(len(outer.body)):
                            self.wfile.write(outer.body[k : k + 1])
                            self.wfile.flush()
                            time.sleep(outer.drip)
                    else:
                        self.wfile.write(outer.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout tests)

            def do_GET(self) -> None:
                self._answer(None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                self._answer(json.loads(self.rfile.read(length)))

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # A short poll interval: shutdown() waits for the serving loop to notice.
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True)
        self.thread.start()

    def answer(self, doc: Any = None, *, status: int = 200, raw: bytes | None = None, delay: float = 0.0) -> None:
        self.status = status
        self.body = raw if raw is not None else json.dumps(doc).encode()
        self.delay = delay

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def call(server: Server, method: str, *args: Any, timeout: float | None = 2.0) -> Any:
    async def go() -> Any:
        async with HttpMemorySource(server.url, timeout=timeout) as src:
            assert isinstance(src, MemoryStore)
            return await getattr(src, method)(*args)

    return asyncio.run(go())


def memory(**over: Any) -> dict[str, Any]:
    m: dict[str, Any] = {
        "id": "m1",
        "content": "Customer prefers email.",
        "similarity": 0.83,
        "confidence": 0.9,
        "rank": 0,
        "organization_id": "acme",
        "agent_id": "support",
    }
    m.update(over)
    return m


def test_cold_round_trip(server: Server) -> None:
    server.answer(
        {
            "memories": [
                memory(token_count=5, token_family="cl100k_base", token_kind="exact", importance=0.4, created_at=1.7e9),
                memory(id="m2", similarity=None, rank=1),
                memory(id="m3", organization_id="globex", rank=2),  # another scope: returned as it came
            ],
            "next": "ignored",
        }
    )
    recs = call(server, "cold", SCOPE, Query("refund policy", (0.5, 0.25)), 10, 0.7)
    method, path, payload = server.requests[-1]
    assert (method, path) == ("POST", "/v1/retrieve")
    assert payload == {
        "organization_id": "acme",
        "agent_id": "support",
        "branch": "cold",
        "query": {"text": "refund policy", "embedding": [0.5, 0.25]},
        "limit": 10,
        "min_similarity": 0.7,
    }
    assert [r.id for r in recs] == ["m1", "m2", "m3"]
    assert all(r.origin is MemoryOrigin.REMOTE for r in recs)
    first = recs[0]
    assert (first.text, first.similarity, first.confidence, first.rank) == ("Customer prefers email.", 0.83, 0.9, 0)
    assert (first.token_count, first.token_family, first.token_kind) == (5, "cl100k_base", "exact")
    assert (first.importance, first.created_at) == (0.4, 1.7e9)
    assert recs[1].similarity is None and recs[1].relevance == 0.5
    assert recs[2].scope == Scope("globex", "support")


def test_exact_counts_travel_with_the_memory_and_missing_ones_are_counted(server: Server) -> None:
    from ctxcore.stores.counting import count_memory_tokens

    text = "Customer prefers email."
    n = int(count_memory_tokens(["m1"], [text], ["cl100k_base"])["cl100k_base"][0])
    # m2 says something else (a near-duplicate of m1 would be left out on its length price)
    # and nothing another test counts (a count kept from an earlier request is "cached").
    other = "Order 48213-HTTP shipped from the Leeds depot on a Tuesday."
    server.answer({"memories": [memory(exact_tokens={"cl100k_base": n}), memory(id="m2", content=other, rank=1)]})
    recs = call(server, "cold", SCOPE, Query("q"), 10, 0.7)
    assert recs[0].exact_tokens == {"cl100k_base": n} and recs[1].exact_tokens is None

    async def go() -> ctxcore.AssembledContext:
        async with HttpMemorySource(server.url, timeout=2.0) as src:
            req = ctxcore.AssemblyRequest("acme", "support", "gpt-4", Query("q"))
            return await ctxcore.assemble(req, sources=ctxcore.Sources(cold=src.cold), config=ROOMY)

    ctx = asyncio.run(go())
    assert {e.memory_id: (e.reason, e.pricing) for e in ctx.trace} == {
        "m1": (ctxcore.TraceReason.SELECTED, "stored"),
        "m2": (ctxcore.TraceReason.SELECTED, "counted"),
    }


def test_hot_and_directive(server: Server) -> None:
    server.answer({"memories": [memory(similarity=None)]})
    recs = call(server, "hot", SCOPE, Query("hi"), 5)
    assert server.requests[-1][2] == {
        "organization_id": "acme",
        "agent_id": "support",
        "branch": "hot",
        "query": {"text": "hi"},
        "limit": 5,
    }
    assert [r.id for r in recs] == ["m1"]
    server.answer({"directive": "Be brief."})
    assert call(server, "directive", Scope("acme corp", "a&b")) == "Be brief."
    assert server.requests[-1][:2] == ("GET", "/v1/directive?organization_id=acme+corp&agent_id=a%26b")
    server.answer({"directive": None})
    assert call(server, "directive", SCOPE) is None
    server.answer({"memories": []})
    assert call(server, "hot", SCOPE, Query(""), 0) == []


MALFORMED: list[tuple[str, bytes, str]] = [
    ("not json", b"<html>oops</html>", "not valid JSON"),
    ("truncated", b'{"memories": [', "not valid JSON"),
    ("not utf-8", b'{"memories": ["\xff"]}', "not valid JSON"),
    ("NaN literal", b'{"memories": [{"id": "m1", "similarity": NaN}]}', "not valid JSON"),
    ("Infinity literal", json.dumps({"memories": [memory()]}).replace("0.9", "Infinity").encode(), "not valid JSON"),
    ("top-level array", b"[]", '"memories" field'),
    ("no memories", b'{"items": []}', '"memories" field'),
    ("memories not a list", b'{"memories": {"id": "m1"}}', "must be an array"),
    ("item not an object", b'{"memories": ["m1"]}', "must be an object"),
    *[
        (
            f"missing {f}",
            json.dumps({"memories": [{k: v for k, v in memory().items() if k != f}]}).encode(),
            f"missing field '{f}'",
        )
        for f in ("id", "content", "similarity", "confidence", "rank", "organization_id", "agent_id")
    ],
    ("id not a string", json.dumps({"memories": [memory(id=7)]}).encode(), "id must be a non-empty string"),
    ("empty agent", json.dumps({"memories": [memory(agent_id="")]}).encode(), "agent_id must be"),
    ("content not a string", json.dumps({"memories": [memory(content=None)]}).encode(), "content must be a string"),
    ("similarity a string", json.dumps({"memories": [memory(similarity="0.8")]}).encode(), "similarity must be"),
    ("similarity above 1", json.dumps({"memories": [memory(similarity=1.5)]}).encode(), "similarity must be"),
    (
        "similarity huge",
        b'{"memories": [' + json.dumps(memory()).replace("0.83", "1e999").encode() + b"]}",
        "similarity must be",
    ),
    *[
        (
            f"{f} an integer beyond any float",
            json.dumps({"memories": [memory(**{f: 10**400})]}).encode(),
            f"{f} must be a finite number",
        )
        for f in ("similarity", "confidence", "importance", "created_at", "accessed_at")
    ],
    ("confidence null", json.dumps({"memories": [memory(confidence=None)]}).encode(), "confidence must be"),
    ("confidence bool", json.dumps({"memories": [memory(confidence=True)]}).encode(), "confidence must be"),
    ("confidence negative", json.dumps({"memories": [memory(confidence=-0.1)]}).encode(), "confidence must be"),
    ("rank negative", json.dumps({"memories": [memory(rank=-1)]}).encode(), "rank must be"),
    ("rank fractional", json.dumps({"memories": [memory(rank=1.5)]}).encode(), "rank must be"),
    ("importance out of range", json.dumps({"memories": [memory(importance=3)]}).encode(), "importance must be"),
    ("token_count without family", json.dumps({"memories": [memory(token_count=5)]}).encode(), "token_family"),
    (
        "token_kind unknown",
        json.dumps({"memories": [memory(token_count=5, token_family="cl100k_base", token_kind="approx")]}).encode(),
        "token_kind",
    ),
    (
        "token_count negative",
        json.dumps({"memories": [memory(token_count=-1, token_family="x", token_kind="exact")]}).encode(),
        "token_count",
    ),
    ("exact_tokens not an object", json.dumps({"memories": [memory(exact_tokens=[5])]}).encode(), "exact_tokens"),
    (
        "exact_tokens negative",
        json.dumps({"memories": [memory(exact_tokens={"cl100k_base": -1})]}).encode(),
        "exact_tokens",
    ),
    (
        "exact_tokens fractional",
        json.dumps({"memories": [memory(exact_tokens={"cl100k_base": 1.5})]}).encode(),
        "exact_tokens",
    ),
    (
        "more than the limit",
        json.dumps({"memories": [memory(id=f"m{k}", rank=k) for k in range(4)]}).encode(),
        "returned 4 memories for a limit of 3",
    ),
    (
        "token_count beyond 2**40",
        json.dumps({"memories": [memory(token_count=2**41, token_family="cl100k_base", token_kind="exact")]}).encode(),
        r"^memories\[0\] \('m1'\): token_count must be an int in \[0, 2\*\*40\]",
    ),
    (
        "one bad item among good ones",
        json.dumps({"memories": [memory(), memory(id="m2", rank="1")]}).encode(),
        r"memories\[1\] \('m2'\): rank",
    ),
]


@pytest.mark.parametrize(("raw", "message"), [(r, m) for _, r, m in MALFORMED], ids=[n for n, _, _ in MALFORMED])
def test_malformed_responses_are_rejected_whole(server: Server, raw: bytes, message: str) -> None:
    server.answer(raw=raw)
    with pytest.raises(MemoryServiceError, match=message):
        call(server, "cold", SCOPE, Query("q"), 3, 0.7)


@pytest.mark.parametrize("raw", [b'{"directive": 5}', b'{"text": "x"}', b"null", b"not json"])
def test_malformed_directive(server: Server, raw: bytes) -> None:
    server.answer(raw=raw)
    with pytest.raises(MemoryServiceError):
        call(server, "directive", SCOPE)


@pytest.mark.parametrize("status", [500, 404, 503, 301])
def test_http_errors(server: Server, status: int) -> None:
    server.answer({"memories": []}, status=status)
    with pytest.raises(MemoryServiceError, match=f"HTTP {status}") as info:
        call(server, "hot", SCOPE, Query("q"), 5)
    assert info.value.status == status


def test_slow_server_hits_the_request_timeout(server: Server) -> None:
    server.answer({"memories": []}, delay=1.0)
    t0 = time.perf_counter()
    with pytest.raises(MemoryServiceError, match="timed out"):
        call(server, "hot", SCOPE, Query("q"), 5, timeout=0.05)
    assert time.perf_counter() - t0 < 0.8


def test_a_server_dripping_its_answer_hits_the_request_timeout(server: Server) -> None:
    # Each byte arrives well within the timeout; the answer as a whole does not.
    server.answer({"memories": []})
    server.drip = 0.05
    t0 = time.perf_counter()
    with pytest.raises(MemoryServiceError, match="no complete response within 0.3 s"):
        call(server, "hot", SCOPE, Query("q"), 5, timeout=0.3)
    assert time.perf_counter() - t0 < 1.0


def test_a_lone_surrogate_id_is_the_response_s_error_not_the_assembly_s(server: Server) -> None:
    # The id is valid JSON (an escape) but not Unicode text: the branch fails, the
    # assembly answers without it.
    server.answer(
        raw=b'{"memories": [{"id": "m\\ud800", "content": "x", "similarity": 0.9, "confidence": 1.0, '
        b'"rank": 0, "organization_id": "acme", "agent_id": "support"}]}'
    )
    with pytest.raises(MemoryServiceError, match="lone surrogate"):
        call(server, "hot", SCOPE, Query("q"), 5)

    async def go() -> ctxcore.AssembledContext:
        async with HttpMemorySource(server.url, timeout=2.0) as src:
            return await ctxcore.assemble(
                ctxcore.AssemblyRequest("acme", "support", "gpt-4o", "q"),
                sources=ctxcore.Sources(hot=src.hot),
                config=ROOMY,
            )

    ctx = asyncio.run(go())
    statuses = {b.branch.value: b.status.value for b in ctx.branches}
    assert statuses["hot"] == "error" and ctx.selected_ids == () and ctx.degraded, statuses


def test_caller_cancellation_stops_the_request(server: Server) -> None:
    server.answer({"memories": []}, delay=1.0)

    async def go() -> None:
        async with HttpMemorySource(server.url, timeout=None) as src:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(src.cold(SCOPE, Query("q"), 5, 0.7), 0.05)
            server.answer({"memories": [memory()]})  # the pool still works afterwards
            assert [r.id for r in await src.hot(SCOPE, Query("q"), 5)] == ["m1"]

    t0 = time.perf_counter()
    asyncio.run(go())
    assert time.perf_counter() - t0 < 0.9


def test_oversized_response_is_rejected(server: Server) -> None:
    server.answer(raw=b'{"memories": [], "pad": "' + b"x" * (MAX_RESPONSE_BYTES + 1) + b'"}')
    with pytest.raises(MemoryServiceError, match="larger than"):
        call(server, "hot", SCOPE, Query("q"), 5)


def test_connection_refused() -> None:
    async def go() -> None:
        async with HttpMemorySource("http://127.0.0.1:9", timeout=1.0) as src:
            await src.directive(SCOPE)

    with pytest.raises(MemoryServiceError):
        asyncio.run(go())


def test_bad_arguments() -> None:
    for url in ("ftp://x", "", "127.0.0.1:80", "http://", "https:///v1", "http://:80", "http://[::1", "http://h:99999"):
        with pytest.raises(ValueError, match="base_url"):
            HttpMemorySource(url)
    assert HttpMemorySource("HTTP://memory.example:8080/").base_url == "HTTP://memory.example:8080"
    for timeout in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout"):
            HttpMemorySource("http://127.0.0.1:9", timeout=timeout)


json_scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=5)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
field_names = st.sampled_from(
    [
        "id",
        "content",
        "similarity",
        "confidence",
        "rank",
        "organization_id",
        "agent_id",
        "importance",
        "created_at",
        "token_count",
        "token_family",
        "token_kind",
    ]
)


@settings(max_examples=300, deadline=None)
@given(doc=json_values)
def test_any_json_is_parsed_or_rejected_whole(doc: Any) -> None:
    try:
        recs = parse_memories(doc, 3)
    except MemoryServiceError:
        return
    assert isinstance(doc, dict) and len(recs) == len(doc["memories"]) <= 3


@settings(max_examples=300, deadline=None)
@given(changes=st.dictionaries(field_names, json_values, min_size=1, max_size=3))
def test_any_field_change_is_parsed_or_rejected_whole(changes: dict[str, Any]) -> None:
    doc = {"memories": [memory(), memory(**{"id": "m2", "rank": 1, **changes})]}
    try:
        recs = parse_memories(doc, 5)
    except MemoryServiceError:
        return
    assert recs[0].id == "m1" and len(recs) == 2
    assert all(isinstance(r.text, str) and 0.0 <= r.confidence <= 1.0 for r in recs)


def test_a_password_in_the_base_url_never_shows() -> None:
    async def go(src: HttpMemorySource) -> None:
        async with src:
            await src.directive(SCOPE)

    src = HttpMemorySource("http://svc:s3cret@127.0.0.1:9/api", timeout=1.0)
    assert "s3cret" not in repr(src) and "svc:***@127.0.0.1:9" in repr(src)
    with pytest.raises(MemoryServiceError) as info:
        asyncio.run(go(src))
    assert "s3cret" not in str(info.value) and "http://svc:***@127.0.0.1:9/api/v1/directive" in str(info.value)
    with pytest.raises(ValueError, match="base_url") as bad:
        HttpMemorySource("http://svc:s3cret@h:99999")
    assert "s3cret" not in str(bad.value)
