"""Input validation at the service's edges, each through the public API: what a caller
sends (lone surrogate escapes and over-long integers in ``tools_json``, an oversized
request made of tools), what an operator configures (gRPC's 32-bit limits, drain and
grace times, TLS files, grants), the signals that stop a server, and what the client
refuses before anything reaches the wire (timeouts, credentials, lone surrogates).

Wire cases run against a real server on a loopback port; configuration cases through
``ctxcore serve`` (in-process `ctxcore.cli.main` when the error comes before the server
starts, a child process otherwise), asserting one error line, a non-zero status and no
traceback.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from service_support import CTXCORE, FakeSources, ServeProcess, make_pki, make_tenants, open_config, running

import ctxcore.cli
from ctxcore.client import MAX_TIMEOUT_S, ContextClient
from ctxcore.errors import ConfigError
from ctxcore.memory import Query
from ctxcore.request import AssemblyOptions, AssemblyRequest, HistoryPolicy, Message
from ctxcore.service import AuthConfig, ContextService, ServiceConfig
from ctxcore.service.config import TlsConfig, parse_service_config
from ctxcore.v1 import context_assembly_pb2 as pb

TENANTS = make_tenants(1)
ORG, AGENT = TENANTS[0].scope.organization_id, TENANTS[0].scope.agent_id


def _req(**kw: Any) -> pb.AssembleContextRequest:
    return pb.AssembleContextRequest(organization_id=ORG, agent_id=AGENT, model="gpt-4o", **kw)


def _with_client(body: Callable[[ContextClient], Awaitable[Any]], **client_kw: Any) -> Any:
    """Run `body` with a client of a real loopback server."""

    async def main() -> Any:
        async with running(open_config(), sources=FakeSources(TENANTS).sources()) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}", **{"timeout": 10.0, **client_kw}) as client:
                return await body(client)

    return asyncio.run(main())


def _outcomes(requests: list[pb.AssembleContextRequest]) -> list[tuple[grpc.StatusCode, str]]:
    async def body(client: ContextClient) -> list[tuple[grpc.StatusCode, str]]:
        out = []
        for r in requests:
            try:
                await client.assemble(r)
                out.append((grpc.StatusCode.OK, ""))
            except grpc.aio.AioRpcError as exc:
                out.append((exc.code(), exc.details() or ""))
        return out

    result: list[tuple[grpc.StatusCode, str]] = _with_client(body)
    return result


def _cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """`ctxcore` in-process: the one error line of a command that must fail with status 1."""
    assert ctxcore.cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctxcore: error: "), err
    return lines[0]


# ---- 1. lone surrogate escapes in tools_json ------------------------------------------


def test_lone_surrogate_escapes_in_tools_json_are_invalid_argument() -> None:
    lone = ['{"d":"\\udc00"}', '{"\\ud800":1}', '{"name":"t","x":["ok","\\uDBFF tail"]}', '{"a":{"b":"\\uDFFF"}}']
    fine = [
        '{"name":"t","d":"\\ud83d\\ude00"}',  # a pair: one character past U+FFFF
        '{"name":"t","d":"\\\\ud800"}',  # an escaped backslash: the text \ud800, no escape
        '{"name":"t","d":"\\u00e9"}',
    ]
    got = _outcomes(
        [_req(tools_json=[t]) for t in lone]
        + [_req(tools_json=['{"name":"ok"}', lone[0]])]
        + [_req(tools_json=[t]) for t in fine]
    )
    for code, details in got[: len(lone)]:
        assert (code, details) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "tools_json[0]: holds a lone surrogate escape (not valid Unicode)",
        )
    assert got[len(lone)] == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "tools_json[1]: holds a lone surrogate escape (not valid Unicode)",
    )
    assert [c for c, _ in got[len(lone) + 1 :]] == [grpc.StatusCode.OK] * len(fine), got


def test_a_valid_surrogate_pair_round_trips() -> None:
    async def body(client: ContextClient) -> pb.AssembledContext:
        return await client.assemble(_req(tools_json=['{"name":"t","description":"\\ud83d\\ude00"}']))

    answer = _with_client(body)
    assert [json.loads(t) for t in answer.tools_json] == [{"name": "t", "description": "\U0001f600"}]


# ---- 5. an oversized request names the part that overflows ----------------------------


def test_an_overflow_names_the_fields_that_carry_it() -> None:
    tool = json.dumps({"name": "t", "description": "lorem ipsum " * 2700})  # ~32 KB, ~5,400 tokens
    history = [pb.Message(role="user", content="word " * 150_000)]  # past 128k tokens alone
    strict = pb.AssemblyOptions(history_policy=pb.HISTORY_POLICY_STRICT)
    got = _outcomes(
        [
            _req(tools_json=[tool] * 128),
            _req(messages=history, options=strict),
            _req(messages=history, tools_json=[tool] * 4, options=strict),
        ]
    )
    assert all(code == grpc.StatusCode.INVALID_ARGUMENT for code, _ in got), got
    heads = [details.split(":", 1)[0] for _, details in got]
    assert heads == ["tools_json", "messages", "messages and tools_json"], got
    assert "does not fit" in got[0][1]


# ---- 6. an over-long integer ------------------------------------------------------------


def test_an_over_long_integer_is_named_without_python_internals() -> None:
    [(code, details)] = _outcomes([_req(tools_json=['{"name":"t","a":' + "9" * 5000 + "}"])])
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details == (
        f"tools_json[0]: is not valid JSON: a number is too long (integers may have at most "
        f"{sys.get_int_max_str_digits()} digits)"
    )
    assert "sys." not in details


# ---- 2, 8. gRPC's 32-bit limits, drain and grace times ----------------------------------


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("max_message_bytes = 2147483648", "server.max_message_bytes"),
        ("max_concurrent_rpcs = 99999999999", "server.max_concurrent_rpcs"),
        ("drain_delay_s = 1e300", "server.drain_delay_s"),
        ("shutdown_grace_s = 1e300", "server.shutdown_grace_s"),
        ("shutdown_grace_s = 3600.5", "server.shutdown_grace_s"),
    ],
)
def test_out_of_range_server_settings_are_one_line_errors(
    toml: str, key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ctxcore.toml"
    path.write_text(f"[server]\n{toml}\n")
    line = _cli_error(["serve", "--config", str(path), "--allow-unauthenticated", "--bind", "127.0.0.1:0"], capsys)
    assert key in line and "at most" in line, line


def test_out_of_range_flags_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--drain-delay-s", "--shutdown-grace-s"):
        line = _cli_error(["serve", flag, "1e300", "--allow-unauthenticated", "--bind", "127.0.0.1:0"], capsys)
        assert flag[2:].replace("-", "_") in line and "at most 3600" in line, line


def test_grpc_limits_are_served_at_their_bound() -> None:
    cfg = open_config(max_message_bytes=2**31 - 1, max_concurrent_rpcs=2**31 - 1)

    async def main() -> str:
        async with running(cfg, sources=FakeSources(TENANTS).sources()) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}", timeout=10.0) as client:
                return (await client.assemble(_req())).model

    assert asyncio.run(main()) == "gpt-4o"
    with pytest.raises(ConfigError, match="server.max_message_bytes must be at most"):
        ServiceConfig(max_message_bytes=2**31)


# ---- 3. TLS files --------------------------------------------------------------------


def _encrypted(key_pem: bytes) -> bytes:
    key = serialization.load_pem_private_key(key_pem, None)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"secret")
    )


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tls")
    pki, other = make_pki("alice"), make_pki("bob")
    files = {
        "cert": pki.server_cert,
        "key": pki.server_key,
        "ca": pki.ca_pem,
        "other_key": other.server_key,
        "encrypted_key": _encrypted(pki.server_key),
        "text": b"root:x:0:0:root:/root:/bin/bash\n",
    }
    out = {}
    for name, data in files.items():
        out[name] = d / f"{name}.pem"
        out[name].write_bytes(data)
    return out


@pytest.mark.parametrize(
    ("cert", "key", "ca", "needle"),
    [
        ("text", "text", None, "auth.tls.cert_file {text}: holds no PEM certificate"),
        ("key", "key", None, "auth.tls.cert_file {key}: holds no PEM certificate"),
        ("cert", "text", None, "auth.tls.key_file {text}: holds no PEM private key"),
        ("cert", "cert", None, "auth.tls.key_file {cert}: holds no PEM private key"),
        (
            "cert",
            "other_key",
            None,
            "auth.tls.key_file {other_key}: is not the private key of the certificate in auth.tls.cert_file {cert}",
        ),
        ("cert", "encrypted_key", None, "auth.tls.key_file {encrypted_key}: the key is encrypted"),
        ("cert", "missing", None, "auth.tls.key_file {missing}: cannot read it"),
        ("cert", "key", "text", "auth.tls.client_ca_file {text}: holds no PEM CA certificate"),
    ],
)
def test_bad_tls_files_are_named_before_the_bind(
    cert: str, key: str, ca: str | None, needle: str, tls_files: dict[str, Path]
) -> None:
    files = {**tls_files, "missing": tls_files["cert"].parent / "missing.pem"}
    tls = TlsConfig(files[cert], files[key], files[ca] if ca else None)
    cfg = ServiceConfig(bind="127.0.0.1:0", drain_delay_s=0.0, auth=AuthConfig(allow_unauthenticated=True, tls=tls))

    async def main() -> None:
        svc = ContextService(cfg, sources=FakeSources(TENANTS).sources())
        try:
            await svc.start()
        finally:
            await svc.stop(0)

    with pytest.raises(ConfigError) as ei:
        asyncio.run(main())
    message = str(ei.value)
    assert message.startswith(needle.format(**{k: str(v) for k, v in files.items()})), message
    assert "bind" not in message


def test_serve_names_a_bad_certificate(tls_files: dict[str, Path], demo_db: Path) -> None:
    r = subprocess.run(
        [
            *CTXCORE,
            "serve",
            "--db",
            str(demo_db),
            "--allow-unauthenticated",
            "--bind",
            "127.0.0.1:0",
            "--tls-cert",
            str(tls_files["text"]),
            "--tls-key",
            str(tls_files["text"]),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if not line.startswith("{")]
    assert errors == [
        f"ctxcore: error: auth.tls.cert_file {tls_files['text']}: holds no PEM certificate "
        "(-----BEGIN CERTIFICATE-----)"
    ], r.stderr


def test_tls_files_are_checked_for_form_not_key_size(tmp_path: Path) -> None:
    """A 1024-bit RSA key (below OpenSSL's default security level, accepted by gRPC)
    still starts: the check is about what the files hold."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "c.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "k.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    tls = TlsConfig(tmp_path / "c.pem", tmp_path / "k.pem")

    async def main() -> int:
        cfg = ServiceConfig(bind="127.0.0.1:0", drain_delay_s=0.0, auth=AuthConfig(allow_unauthenticated=True, tls=tls))
        async with running(cfg, sources=FakeSources(TENANTS).sources()) as svc:
            return svc.port

    assert asyncio.run(main()) > 0


# ---- 7. grants -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("grant", "needle"),
    [
        ("a/b/c", "has 2 slashes; ORG/AGENT has exactly one, and the agent may be '*'"),
        ("acme", "has no slash"),
        ("acme/", "has an empty agent"),
        ("*/x", "the organization cannot be a wildcard"),
        ("acme /x", "has surrounding whitespace or a control character in its organization"),
        ("acme/ x", "has surrounding whitespace or a control character in its agent"),
        ("acme/x\x7f", "has surrounding whitespace or a control character in its agent"),
    ],
)
def test_a_bad_grant_says_what_is_wrong(grant: str, needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = _cli_error(["serve", "--grant", f"svc-a={grant}", "--allow-unauthenticated"], capsys)
    assert f"grant {grant!r} {needle}" in line or needle in line, line
    if grant != "*/x":
        assert "wildcard" not in line, line
    with pytest.raises(ConfigError, match=needle.replace("*", r"\*")):
        parse_service_config(f"[auth.principals]\nsvc = [{json.dumps(grant)}]")


# ---- 8. a second signal stops at once -------------------------------------------------


@pytest.mark.parametrize(("first", "second"), [(signal.SIGTERM, signal.SIGTERM), (signal.SIGINT, signal.SIGINT)])
def test_a_second_signal_cuts_the_drain_short(
    first: signal.Signals, second: signal.Signals, demo_db: Path, tmp_path: Path
) -> None:
    s = ServeProcess(
        tmp_path, "--db", str(demo_db), "--allow-unauthenticated", "--drain-delay-s", "600", "--shutdown-grace-s", "600"
    )
    try:
        s.proc.send_signal(first)
        deadline = time.monotonic() + 30
        while not any(e["event"] == "draining" for e in s.events()):
            assert time.monotonic() < deadline and s.proc.poll() is None, s.log_path.read_text()
            time.sleep(0.05)
        t0 = time.monotonic()
        s.proc.send_signal(second)
        rc = s.proc.wait(30)
        took = time.monotonic() - t0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
        s.stop()
    assert rc == 128 + second.value, s.log_path.read_text()
    assert took < 10, took
    log = s.log_path.read_text()
    assert "Traceback" not in log, log
    events = s.events()
    signals = [e for e in events if e["event"] == "signal"]
    assert [e["signal"] for e in signals] == [first.name, second.name], signals
    assert signals[1].get("action") == "stop_now" and signals[1]["level"] == "warning", signals
    assert events[-1]["event"] == "stopped", events


def test_stop_now_cancels_calls_in_flight_during_the_drain() -> None:
    started = asyncio.Event()

    async def slow_assemble(request: Any, **kw: Any) -> Any:
        started.set()
        await asyncio.sleep(60)
        raise AssertionError("not cancelled")

    async def main() -> tuple[grpc.StatusCode, float]:
        svc = ContextService(
            open_config(shutdown_grace_s=600.0, drain_delay_s=600.0),
            sources=FakeSources(TENANTS).sources(),
            assemble=slow_assemble,
        )
        await svc.start()
        async with ContextClient(f"127.0.0.1:{svc.port}", timeout=120.0) as client:
            call = asyncio.ensure_future(client.assemble(_req()))
            await started.wait()
            stopping = asyncio.ensure_future(svc.stop())
            await asyncio.sleep(0.1)
            assert not stopping.done()
            t0 = time.monotonic()
            await svc.stop_now()
            await stopping
            took = time.monotonic() - t0
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await call
            return ei.value.code(), took

    code, took = asyncio.run(main())
    assert code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE), code
    assert took < 5, took


# ---- 4, 9. the client's own checks ------------------------------------------------------


@pytest.mark.parametrize("bad", [float("inf"), 1e10, float("nan"), 0, -1.0, MAX_TIMEOUT_S * 1.5, True, "1"])
def test_client_timeouts_must_be_finite_and_bounded(bad: Any) -> None:
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds") as ei:
        ContextClient("127.0.0.1:1", timeout=bad)
    assert repr(bad) in str(ei.value)

    async def body(client: ContextClient) -> list[str]:
        out = []
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: client.assemble(_req(), timeout=bad),
            lambda: client.compute_budget("gpt-4o", timeout=bad),
            lambda: client.model_capabilities("gpt-4o", timeout=bad),
        ]
        for call in calls:
            with pytest.raises(ValueError) as ei:
                await call()
            out.append(str(ei.value))
        # The client still works: the bound itself is a valid deadline.
        await client.assemble(_req(), timeout=MAX_TIMEOUT_S)
        return out

    for message in _with_client(body):
        assert message.startswith("timeout must be a finite number") and repr(bad) in message, message


def test_the_longest_timeout_is_served() -> None:
    async def body(client: ContextClient) -> str:
        return (await client.assemble(AssemblyRequest(ORG, AGENT, "gpt-4o", Query("q")))).model

    assert _with_client(body, timeout=MAX_TIMEOUT_S) == "gpt-4o"


@pytest.mark.parametrize("key", ["clé-secrète", "key\nx-evil: 1", "tab\tkey", "emoji-\U0001f511"])
def test_api_keys_and_tokens_must_be_printable_ascii(key: str) -> None:
    with pytest.raises(ValueError, match="api_key must be printable ASCII") as ei:
        ContextClient("127.0.0.1:1", api_key=key)
    assert key not in str(ei.value)  # a secret is never echoed
    with pytest.raises(ValueError, match="token must be printable ASCII"):
        ContextClient("127.0.0.1:1", token=key)

    async def body(client: ContextClient) -> str:
        with pytest.raises(ValueError, match="token must be printable ASCII") as ei:
            await client.assemble(_req())
        return str(ei.value)

    assert key not in _with_client(body, token=lambda: key)


def _requests_with_a_lone_surrogate() -> Iterator[tuple[str, AssemblyRequest]]:
    bad = "x\udc00y"
    yield "query.text", AssemblyRequest(ORG, AGENT, "gpt-4o", Query(bad))
    yield (
        "messages[1].content",
        AssemblyRequest(ORG, AGENT, "gpt-4o", Query("q"), (Message("user", "hi"), Message("assistant", bad))),
    )
    yield "tools_json[0]", AssemblyRequest(ORG, AGENT, "gpt-4o", Query("q"), tools=({"name": "t", "description": bad},))
    yield (
        "options.pinned_memory_ids",
        AssemblyRequest(
            ORG,
            AGENT,
            "gpt-4o",
            Query("q"),
            options=AssemblyOptions(pinned_memory_ids=frozenset({bad}), history_policy=HistoryPolicy.TRIM_OLDEST),
        ),
    )


def test_a_lone_surrogate_is_named_by_the_client() -> None:
    cases = list(_requests_with_a_lone_surrogate())

    async def body(client: ContextClient) -> list[str]:
        out = []
        for _, req in cases:
            with pytest.raises(ValueError) as ei:
                await client.assemble(req)
            out.append(str(ei.value))
        names: list[Callable[[], Awaitable[Any]]] = [
            lambda: client.compute_budget("gpt-\udc00"),
            lambda: client.model_capabilities("gpt-4o", "\ud800"),
        ]
        for call in names:
            with pytest.raises(ValueError) as ei:
                await call()
            out.append(str(ei.value))
        await client.assemble(_req())  # the client still works
        return out

    got = _with_client(body)
    fields = [field for field, _ in cases] + ["model", "models[1]"]
    for field, message in zip(fields, got, strict=True):
        assert message.startswith(f"{field}: holds a lone surrogate"), (field, message)


# ---- a query embedding of another dimension than the store's ----------------------------


def test_a_query_embedding_of_the_wrong_dimension_is_invalid_argument(demo_db: Path) -> None:
    """The demo store holds 256-dimensional embeddings: a 3-dimensional query is the
    caller's error, named with the dimension the store expects; a right one is served."""

    async def main() -> list[tuple[grpc.StatusCode, str, list[str]]]:
        out = []
        async with running(open_config(db=demo_db)) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}", timeout=10.0) as client:
                for emb in ([0.1, 0.2, 0.3], [1.0] + [0.0] * 255):
                    req = pb.AssembleContextRequest(
                        organization_id="acme-retail",
                        agent_id="support",
                        model="gpt-4o",
                        query=pb.Query(text="refund for shoes", embedding=emb),
                    )
                    try:
                        ctx = await client.assemble(req)
                        out.append((grpc.StatusCode.OK, "", list(ctx.degradation_reasons)))
                    except grpc.aio.AioRpcError as exc:
                        out.append((exc.code(), exc.details() or "", []))
        return out

    wrong, right = asyncio.run(main())
    assert wrong[0] == grpc.StatusCode.INVALID_ARGUMENT, wrong
    assert "query.embedding" in wrong[1] and "3 dimensions" in wrong[1] and "256" in wrong[1], wrong
    # (a branch may still time out on a loaded machine; none fails)
    assert right[0] == grpc.StatusCode.OK and not [r for r in right[2] if r.endswith("_error")], right


# ---- a message's content beside its parts ------------------------------------------------


def test_content_that_is_not_the_join_of_the_parts_is_invalid_argument() -> None:
    """With parts, a message's content is empty or the parts joined by a newline; any
    other content is refused by name rather than replaced by the parts."""

    def msg(content: str, parts: list[str]) -> pb.AssembleContextRequest:
        return _req(
            messages=[
                pb.Message(role="user", content="first"),
                pb.Message(role="user", content=content, parts=parts, has_parts=True),
            ]
        )

    got = _outcomes([msg("other text", ["a", "b"]), msg("lost", []), msg("a\nb", ["a", "b"]), msg("", ["a", "b"])])
    for code, details in got[:2]:
        assert (code, details) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "messages[1]: content must be empty or the parts joined by a newline when parts are given",
        )
    assert got[2:] == [(grpc.StatusCode.OK, "")] * 2, got


@pytest.mark.parametrize(
    "bad", [{"organization_id": ORG, "agent_id": AGENT, "model": "gpt-4o"}, None, pb.ComputeBudgetRequest(model="m")]
)
def test_the_client_refuses_arguments_of_the_wrong_type(bad: Any) -> None:
    """A request or a model name of the wrong type is a TypeError naming it, before
    anything is sent (gRPC would send an empty or a foreign request in its place)."""

    async def body(client: ContextClient) -> list[str]:
        out = []
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: client.assemble(bad),
            lambda: client.compute_budget(bad),
            lambda: client.model_capabilities("gpt-4o", bad),
        ]
        for call in calls:
            with pytest.raises(TypeError) as ei:
                await call()
            out.append(str(ei.value))
        await client.assemble(_req())  # the client still works
        return out

    got = _with_client(body)
    kind = type(bad).__name__
    assert got == [
        f"request must be a ctxcore.AssemblyRequest or a ctxcore.v1.AssembleContextRequest, got {kind}",
        f"model must be a str, got {kind}",
        f"models[1] must be a str, got {kind}",
    ]


@pytest.mark.parametrize("policy", ["round-robin", "ROUND_ROBIN", "", "ring_hash_experimental"])
def test_an_unknown_load_balancing_policy_is_refused_by_the_client(policy: str) -> None:
    """gRPC would read the name only at the first call, and fail every call with
    INVALID_ARGUMENT or INTERNAL as if the server had refused it."""
    with pytest.raises(ValueError, match="load_balancing must be one of round_robin, pick_first") as ei:
        ContextClient("127.0.0.1:1", load_balancing=policy)
    assert repr(policy) in str(ei.value)


@pytest.mark.parametrize("policy", ["round_robin", "pick_first", "weighted_round_robin"])
def test_the_client_load_balancing_policies_are_served(policy: str) -> None:
    async def body(client: ContextClient) -> str:
        return (await client.assemble(_req())).model

    assert _with_client(body, load_balancing=policy) == "gpt-4o"


@pytest.mark.parametrize(
    ("flag", "rest"),
    [
        ("--config", ["--allow-unauthenticated"]),
        ("--db", ["--allow-unauthenticated"]),
        ("--catalog", ["--allow-unauthenticated"]),
        ("--metrics-bind", ["--allow-unauthenticated", "--metrics-port", "0"]),
        ("--api-key-file", ["--grant", "svc=org/agent"]),
        ("--tls-cert", ["--tls-key", "key.pem", "--allow-unauthenticated"]),
        ("--tls-key", ["--tls-cert", "cert.pem", "--allow-unauthenticated"]),
        ("--tls-client-ca", ["--tls-cert", "cert.pem", "--tls-key", "key.pem", "--grant", "svc=org/agent"]),
        ("--jwt-issuer", ["--jwt-audience", "a", "--jwt-key-file", "k.pem", "--jwt-algorithm", "RS256"]),
        ("--jwt-audience", ["--jwt-issuer", "i", "--jwt-key-file", "k.pem", "--jwt-algorithm", "RS256"]),
        ("--jwt-key-file", ["--jwt-issuer", "i", "--jwt-audience", "a", "--jwt-algorithm", "RS256"]),
    ],
)
def test_an_empty_flag_value_is_named(flag: str, rest: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """An empty value (an unset variable in ``--tls-cert "$CERT"``) is refused by name,
    never taken as the flag left out (a server without TLS, say, or the default store)."""
    line = _cli_error(["serve", "--bind", "127.0.0.1:0", flag, "", *rest], capsys)
    assert line == f"ctxcore: error: {flag} must not be empty", line


@pytest.mark.parametrize(
    ("bind", "why"),
    [
        ("::1:50051", " (an IPv6 address goes in brackets)"),
        ("[::1:50051", " (an IPv6 address goes in brackets)"),
        ("unix:", " (a unix: bind needs the socket's path)"),
        ("127.0.0.1:\u0665\u0660\u0660\u0665\u0661", ""),  # Arabic-Indic digits
    ],
)
def test_a_bind_grpc_would_read_otherwise_is_refused(bind: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A bind gRPC reads differently (``::1:50051`` is one IPv6 address on port 443, not
    the loopback on 50051), or cannot serve on, is refused by name before anything starts."""
    line = _cli_error(["serve", "--bind", bind, "--allow-unauthenticated"], capsys)
    assert line == f"ctxcore: error: server.bind must be 'host:port', '[v6]:port' or 'unix:PATH', got {bind!r}{why}"
    with pytest.raises(ConfigError, match="server.bind must be"):
        parse_service_config(f"[server]\nbind = {json.dumps(bind)}")


def test_what_a_payload_rendering_cannot_carry_is_named_in_wire_terms() -> None:
    """A tool or a tool result the payload renderings cannot carry is named by its wire
    field (``tools_json[1]``, ``messages[0]``), not by the Python request's."""
    openai = pb.AssemblyOptions(rendering=pb.RENDERING_OPENAI)
    got = _outcomes(
        [
            _req(tools_json=['{"name":"ok"}', '{"x":1}'], options=openai),
            _req(messages=[pb.Message(role="tool", content="42", tool_call_id="c9")], options=openai),
        ]
    )
    assert [code for code, _ in got] == [grpc.StatusCode.INVALID_ARGUMENT] * 2, got
    assert got[0][1].startswith("tools_json[1]: not a function tool"), got
    assert (
        got[1][1] == "messages[0]: the tool result for 'c9' does not follow the assistant message that made that call"
    )


def test_a_config_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "ctxcore.toml"
    path.write_text('[server]\nbind = "127.0.0.1:7001"\n', encoding="utf-8-sig")
    from ctxcore.service import load_service_config

    assert load_service_config(path).bind == "127.0.0.1:7001"


def test_api_key_refuses_a_principal_the_key_file_would_read_as_a_comment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ctxcore api-key '#admin'`` would print a line the key file skips as a comment,
    so that the key it gives out never authenticates: it is refused by name."""
    line = _cli_error(["api-key", "#admin"], capsys)
    assert line == (
        "ctxcore: error: the principal must not start with '#': the API key file reads that line as a comment"
    )
    assert ctxcore.cli.main(["api-key", "ad#min"]) == 0  # a '#' inside a name is part of it
    printed = capsys.readouterr().out
    entry = next(x for x in printed.splitlines() if x.startswith("line:")).split(None, 1)[1]
    (tmp_path / "keys.txt").write_text(entry + "\n")
    from ctxcore.service.auth import load_api_key_file

    assert list(load_api_key_file(tmp_path / "keys.txt").values()) == ["ad#min"]


@pytest.mark.parametrize("char", ["\x00", "\x1b", "\x7f", "\x85", "\x9f"])
def test_ids_holding_a_control_character_are_invalid_argument(char: str) -> None:
    """Every control character (C0, DEL and C1: NEL splits a log line as a newline does)
    is refused inside an organization, agent or pinned memory id, by field."""
    got = _outcomes(
        [
            pb.AssembleContextRequest(organization_id=f"org{char}1", agent_id=AGENT, model="gpt-4o"),
            pb.AssembleContextRequest(organization_id=ORG, agent_id=f"agent{char}", model="gpt-4o"),
            _req(options=pb.AssemblyOptions(pinned_memory_ids=[f"m{char}1"])),
        ]
    )
    why = "must not contain surrounding whitespace or control characters"
    assert got == [
        (grpc.StatusCode.INVALID_ARGUMENT, f"organization_id: {why}"),
        (grpc.StatusCode.INVALID_ARGUMENT, f"agent_id: {why}"),
        (grpc.StatusCode.INVALID_ARGUMENT, f"options.pinned_memory_ids[0]: {why}"),
    ]


@pytest.mark.parametrize(
    ("target", "error"), [("", ValueError), ("  ", ValueError), (None, TypeError), (7001, TypeError)]
)
def test_the_client_refuses_a_target_that_is_not_one(target: Any, error: type[Exception]) -> None:
    """gRPC reads an empty target only at the first call and fails every call UNKNOWN
    (a None or a number, AttributeError): the client refuses it when built."""
    with pytest.raises(error, match="target must"):
        ContextClient(target)


def test_each_log_record_stays_one_line_for_every_reader(demo_db: Path, tmp_path: Path) -> None:
    """An id holding U+2028 or U+2029 (line boundaries to str.splitlines) is logged
    escaped: every line of the log is one JSON record, and the id reads back whole."""
    org = "acme\u2028re\u2029tail"
    s = ServeProcess(tmp_path, "--db", str(demo_db), "--allow-unauthenticated")

    async def main() -> grpc.StatusCode:
        async with ContextClient(s.target, timeout=10.0) as client:
            try:
                await client.assemble(
                    pb.AssembleContextRequest(organization_id=org, agent_id="support", model="gpt-4o")
                )
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

    try:
        assert asyncio.run(main()) == grpc.StatusCode.OK
    finally:
        assert s.stop() == 0
    lines = s.log_path.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["organization_id"] for r in records if r["event"] == "call"] == [org]


@pytest.mark.parametrize(
    ("toml", "key"),
    [("relevance_floor = 0.7", "assembly.relevance_floor"), ("rerank_timeout_ms = 0", "assembly.rerank_timeout_ms")],
)
def test_an_assembly_setting_out_of_its_bounds_is_named_with_its_file(
    toml: str, key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value ``AssemblyConfig`` refuses is named as the key of its section, after the
    file it is in, as every other bad setting is."""
    path = tmp_path / "ctxcore.toml"
    path.write_text(f"[assembly]\n{toml}\n")
    line = _cli_error(["serve", "--config", str(path), "--allow-unauthenticated", "--bind", "127.0.0.1:0"], capsys)
    assert line.startswith(f"ctxcore: error: {path}: {key} must be "), line
