"""Authentication and authorization at the gRPC boundary, against a real server on a
loopback port: every (credential x requested organization/agent) cell gets its status;
bad tokens of every kind are UNAUTHENTICATED; mTLS with and without a client certificate;
the authenticated principal, not the request, scopes retrieval."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from service_support import (
    AUDIENCE,
    ISSUER,
    FakeSources,
    api_key_file,
    make_jwt,
    make_pki,
    make_tenants,
    rsa_keypair,
    running,
    unsigned_jwt,
)

from ctxcore.client import ContextClient
from ctxcore.memory import Query
from ctxcore.request import AssemblyRequest
from ctxcore.service import AuthConfig, ClientAuth, Grant, JwtConfig, ServiceConfig, TlsConfig

OK, UNAUTH, DENIED = grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED

TENANTS = make_tenants(3)
T0, T1, T2 = (t.scope for t in TENANTS)
# alice: tenant 0's agent only; bob: every agent of tenant 1; carol: authenticated, no grants.
PRINCIPALS = {
    "alice": (Grant(T0.organization_id, T0.agent_id),),
    "bob": (Grant(T1.organization_id, "*"),),
    "carol": (),
}


async def _call(client: ContextClient, org: str, agent: str) -> tuple[grpc.StatusCode, Any]:
    try:
        r = await client.assemble(AssemblyRequest(org, agent, "gpt-4o", Query("secret marker")), timeout=2.0)
        return OK, r
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("auth")
    priv, pub = rsa_keypair()
    other_priv, _ = rsa_keypair()
    (d / "issuer.pem").write_bytes(pub)
    api = {"bob": "bob-key-" + "b" * 40, "carol": "carol-key-" + "c" * 40}
    return {"dir": d, "priv": priv, "pub": pub, "other_priv": other_priv, "api": api, "keyfile": api_key_file(d, api)}


def _bearer_config(keys: dict[str, Any], **kw: Any) -> ServiceConfig:
    return ServiceConfig(
        bind="127.0.0.1:0",
        auth=AuthConfig(
            jwt=JwtConfig(ISSUER, AUDIENCE, ("RS256",), keys["dir"] / "issuer.pem", leeway_s=0),
            api_key_file=keys["keyfile"],
            principals=PRINCIPALS,
        ),
        **kw,
    )


def test_credential_matrix(keys: dict[str, Any]) -> None:
    priv, pub = keys["priv"], keys["pub"]
    creds: dict[str, dict[str, Any]] = {
        "alice-jwt": {"token": make_jwt(priv, "alice")},
        "bob-key": {"api_key": keys["api"]["bob"]},
        "carol-jwt": {"token": make_jwt(priv, "carol")},
        "carol-key": {"api_key": keys["api"]["carol"]},
        "expired": {"token": make_jwt(priv, "alice", ttl=-60)},
        "wrong-audience": {"token": make_jwt(priv, "alice", aud="someone-else")},
        "wrong-issuer": {"token": make_jwt(priv, "alice", iss="https://evil.test")},
        "wrong-signature": {"token": make_jwt(keys["other_priv"], "alice")},
        "alg-none": {"token": unsigned_jwt("alice")},
        "hs256-with-public-key": {"token": _hs256_confusion(pub, "alice")},
        "no-exp": {"token": jwt.encode({"sub": "alice", "aud": AUDIENCE, "iss": ISSUER}, priv, algorithm="RS256")},
        "garbage-token": {"token": "not.a.jwt"},
        "unknown-key": {"api_key": "nobody-" + "x" * 40},
        "nothing": {},
    }
    targets = {
        "t0": T0,
        "t0-other-agent": type(T0)(T0.organization_id, "agent-999"),
        "t1": T1,
        "t1-other-agent": type(T1)(T1.organization_id, "agent-777"),
        "t2": T2,
    }
    expected = {
        "alice-jwt": {"t0": OK, "t0-other-agent": DENIED, "t1": DENIED, "t1-other-agent": DENIED, "t2": DENIED},
        "bob-key": {"t0": DENIED, "t0-other-agent": DENIED, "t1": OK, "t1-other-agent": OK, "t2": DENIED},
        "carol-jwt": dict.fromkeys(targets, DENIED),
        "carol-key": dict.fromkeys(targets, DENIED),
    }

    async def main() -> dict[tuple[str, str], grpc.StatusCode]:
        fake = FakeSources(TENANTS)
        out = {}
        async with running(_bearer_config(keys), sources=fake.sources()) as svc:
            for cname, kw in creds.items():
                async with ContextClient(f"127.0.0.1:{svc.port}", **kw) as client:
                    for tname, scope in targets.items():
                        code, body = await _call(client, scope.organization_id, scope.agent_id)
                        out[cname, tname] = code
                        if code == OK:
                            assert body.scope.organization_id == scope.organization_id
                            assert body.principal == cname.split("-")[0]
                        else:
                            assert "Traceback" not in body
            # retrieval only ever ran for scopes a principal was granted
            assert set(fake.asked) <= {T0, T1, type(T1)(T1.organization_id, "agent-777")}
        return out

    got = asyncio.run(main())
    for (cname, tname), code in got.items():
        want = expected.get(cname, {}).get(tname, UNAUTH)
        assert code == want, f"{cname} -> {tname}: got {code.name}, want {want.name}"


def _hs256_confusion(public_pem: bytes, sub: str) -> str:
    """A token 'signed' with HS256 using the RSA public key as the HMAC secret."""
    import base64
    import hashlib
    import hmac
    import json
    import time

    def b64(b: bytes) -> str:
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

    now = int(time.time())
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"sub": sub, "aud": AUDIENCE, "iss": ISSUER, "exp": now + 300}).encode())
    sig = hmac.new(public_pem, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(sig)}"


def test_budget_and_catalog_need_credentials_too(keys: dict[str, Any]) -> None:
    async def main() -> None:
        async with running(_bearer_config(keys), sources=FakeSources(TENANTS).sources()) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}") as anon:
                for call in (anon.compute_budget("gpt-4o"), anon.model_capabilities("gpt-4o")):
                    with pytest.raises(grpc.aio.AioRpcError) as ei:
                        await call
                    assert ei.value.code() == UNAUTH
            async with ContextClient(f"127.0.0.1:{svc.port}", api_key=keys["api"]["bob"]) as bob:
                b = await bob.compute_budget("gpt-4o", directive_tokens=10)
                assert b.usable > 0
                (cap,) = await bob.model_capabilities("gpt-4o")
                assert cap.context_window == 128000

    asyncio.run(main())


def test_mtls(tmp_path: Path) -> None:
    mode = ClientAuth.REQUIRE
    pki = make_pki("alice")
    files = pki.write(tmp_path)
    cfg = ServiceConfig(
        bind="127.0.0.1:0",
        auth=AuthConfig(
            tls=TlsConfig(files["server_cert"], files["server_key"], files["ca_pem"], mode),
            principals=PRINCIPALS,
        ),
    )

    async def main() -> None:
        fake = FakeSources(TENANTS)
        async with running(cfg, sources=fake.sources()) as svc:
            target = f"localhost:{svc.port}"
            async with ContextClient(
                target, root_certificates=pki.ca_pem, certificate_chain=pki.client_cert, private_key=pki.client_key
            ) as client:
                code, body = await _call(client, T0.organization_id, T0.agent_id)
                assert code == OK and body.principal == "alice"
                code, _ = await _call(client, T1.organization_id, T1.agent_id)
                assert code == DENIED
            # no client certificate: the handshake fails
            async with ContextClient(target, root_certificates=pki.ca_pem) as client:
                code, _ = await _call(client, T0.organization_id, T0.agent_id)
                assert code == grpc.StatusCode.UNAVAILABLE
            # a certificate with the right name from another CA is refused at the handshake
            async with ContextClient(
                target, root_certificates=pki.ca_pem, certificate_chain=pki.rogue_cert, private_key=pki.rogue_key
            ) as client:
                code, _ = await _call(client, T0.organization_id, T0.agent_id)
                assert code == grpc.StatusCode.UNAVAILABLE
            # plaintext to a TLS port fails
            async with ContextClient(target) as client:
                code, _ = await _call(client, T0.organization_id, T0.agent_id)
                assert code == grpc.StatusCode.UNAVAILABLE
            assert set(fake.asked) == {T0}

    asyncio.run(main())


def test_hmac_secret_too_short_is_refused(tmp_path: Path) -> None:
    from ctxcore.errors import ConfigError
    from ctxcore.service import ContextService

    (tmp_path / "s").write_text("short")
    cfg = ServiceConfig(
        bind="127.0.0.1:0",
        auth=AuthConfig(jwt=JwtConfig(ISSUER, AUDIENCE, ("HS256",), tmp_path / "s"), principals=PRINCIPALS),
    )
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        ContextService(cfg, sources=FakeSources(TENANTS).sources())


def test_hs256_tokens(tmp_path: Path) -> None:
    secret = b"s" * 48
    (tmp_path / "s").write_bytes(secret)
    cfg = ServiceConfig(
        bind="127.0.0.1:0",
        auth=AuthConfig(jwt=JwtConfig(ISSUER, AUDIENCE, ("HS256",), tmp_path / "s"), principals=PRINCIPALS),
    )

    async def main() -> None:
        async with running(cfg, sources=FakeSources(TENANTS).sources()) as svc:
            good = make_jwt(secret, "alice", alg="HS256")
            bad = make_jwt(b"t" * 48, "alice", alg="HS256")
            async with ContextClient(f"127.0.0.1:{svc.port}", token=lambda: good) as c:
                assert (await _call(c, T0.organization_id, T0.agent_id))[0] == OK
            async with ContextClient(f"127.0.0.1:{svc.port}", token=bad) as c:
                assert (await _call(c, T0.organization_id, T0.agent_id))[0] == UNAUTH

    asyncio.run(main())


def test_server_tls_with_bearer_tokens(tmp_path: Path, keys: dict[str, Any]) -> None:
    """TLS without client certificates: callers authenticate with tokens or keys."""
    pki = make_pki("unused")
    files = pki.write(tmp_path)
    cfg = ServiceConfig(
        bind="127.0.0.1:0",
        auth=AuthConfig(
            tls=TlsConfig(files["server_cert"], files["server_key"]),
            api_key_file=keys["keyfile"],
            principals=PRINCIPALS,
        ),
    )

    async def main() -> None:
        async with running(cfg, sources=FakeSources(TENANTS).sources()) as svc:
            target = f"localhost:{svc.port}"
            async with ContextClient(target, root_certificates=pki.ca_pem, api_key=keys["api"]["bob"]) as c:
                assert (await _call(c, T1.organization_id, T1.agent_id))[0] == OK
            async with ContextClient(target, root_certificates=pki.ca_pem) as c:
                assert (await _call(c, T1.organization_id, T1.agent_id))[0] == UNAUTH

    asyncio.run(main())


@pytest.mark.parametrize("alg", ["RS256", "PS256"])
def test_issuer_private_key_as_key_file_verifies_tokens(tmp_path: Path, alg: str) -> None:
    """A private key in auth.jwt.key_file verifies with its public half: a good token is
    OK and a token signed by another key is UNAUTHENTICATED, neither is INTERNAL."""
    priv, _ = rsa_keypair()
    other, _ = rsa_keypair()
    (tmp_path / "issuer-key.pem").write_bytes(priv)
    cfg = ServiceConfig(
        bind="127.0.0.1:0",
        auth=AuthConfig(jwt=JwtConfig(ISSUER, AUDIENCE, (alg,), tmp_path / "issuer-key.pem"), principals=PRINCIPALS),
    )

    async def main() -> None:
        async with running(cfg, sources=FakeSources(TENANTS).sources()) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}", token=make_jwt(priv, "alice", alg=alg)) as c:
                assert (await _call(c, T0.organization_id, T0.agent_id))[0] == OK
            async with ContextClient(f"127.0.0.1:{svc.port}", token=make_jwt(other, "alice", alg=alg)) as c:
                assert await _call(c, T0.organization_id, T0.agent_id) == (UNAUTH, "bearer token signature is invalid")

    asyncio.run(main())


def test_public_key_as_hmac_secret_is_refused_at_start(tmp_path: Path, keys: dict[str, Any]) -> None:
    """An HS* key_file holding a PEM public key is refused when the server is built:
    PyJWT would refuse it as a secret at every token."""
    from ctxcore.errors import ConfigError
    from ctxcore.service import ContextService

    cfg = ServiceConfig(
        bind="127.0.0.1:0",
        auth=AuthConfig(jwt=JwtConfig(ISSUER, AUDIENCE, ("HS256",), keys["dir"] / "issuer.pem"), principals=PRINCIPALS),
    )
    with pytest.raises(ConfigError, match=r"issuer\.pem holds a PEM or SSH key or a certificate, not an HMAC secret"):
        ContextService(cfg, sources=FakeSources(TENANTS).sources())


def test_a_token_not_valid_yet_says_so(keys: dict[str, Any]) -> None:
    """A token whose 'nbf' or 'iat' lies ahead (a clock out of step) is UNAUTHENTICATED
    with the reason, not as an invalid token."""
    future = int(time.time()) + 600

    async def main() -> list[tuple[grpc.StatusCode, Any]]:
        out = []
        async with running(_bearer_config(keys), sources=FakeSources(TENANTS).sources()) as svc:
            for claim in ("nbf", "iat"):
                token = make_jwt(keys["priv"], "alice", **{claim: future})
                async with ContextClient(f"127.0.0.1:{svc.port}", token=token) as client:
                    out.append(await _call(client, T0.organization_id, T0.agent_id))
        return out

    for got in asyncio.run(main()):
        assert got == (UNAUTH, "bearer token is not valid yet (its 'nbf' or 'iat' is in the future: check the clocks)")


def test_a_principal_claim_that_is_not_a_string_is_named(keys: dict[str, Any]) -> None:
    """With principal_claim = "client_id", a token whose client_id is a number is refused
    saying what it is, an empty one saying it is empty."""
    cfg = ServiceConfig(
        bind="127.0.0.1:0",
        auth=AuthConfig(
            jwt=JwtConfig(ISSUER, AUDIENCE, ("RS256",), keys["dir"] / "issuer.pem", principal_claim="client_id"),
            principals=PRINCIPALS,
        ),
    )

    async def main() -> list[tuple[grpc.StatusCode, Any]]:
        out = []
        async with running(cfg, sources=FakeSources(TENANTS).sources()) as svc:
            for client_id in (12345, ["alice"], "", "alice"):
                token = make_jwt(keys["priv"], "someone", client_id=client_id)
                async with ContextClient(f"127.0.0.1:{svc.port}", token=token) as client:
                    code, body = await _call(client, T0.organization_id, T0.agent_id)
                    out.append((code, body if code != OK else body.principal))
        return out

    assert asyncio.run(main()) == [
        (UNAUTH, "bearer token 'client_id' claim must be a string, got int"),
        (UNAUTH, "bearer token 'client_id' claim must be a string, got list"),
        (UNAUTH, "bearer token 'client_id' claim is empty"),
        (OK, "alice"),
    ]


def test_a_byte_order_mark_is_not_part_of_a_principal(tmp_path: Path) -> None:
    """An API key file saved with a UTF-8 byte order mark (as editors on Windows write
    it) authenticates its first line's principal by its name."""
    from ctxcore.service import hash_api_key

    path = tmp_path / "keys.txt"
    path.write_text(f"alice {hash_api_key('alice-key-' + 'a' * 40)}\n", encoding="utf-8-sig")
    cfg = ServiceConfig(bind="127.0.0.1:0", auth=AuthConfig(api_key_file=path, principals=PRINCIPALS))

    async def main() -> tuple[grpc.StatusCode, Any]:
        async with running(cfg, sources=FakeSources(TENANTS).sources()) as svc:
            async with ContextClient(f"127.0.0.1:{svc.port}", api_key="alice-key-" + "a" * 40) as client:
                code, body = await _call(client, T0.organization_id, T0.agent_id)
                return code, body if code != OK else body.principal

    assert asyncio.run(main()) == (OK, "alice")
