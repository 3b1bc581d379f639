"""Caller authentication and authorization at the gRPC boundary.

Every call is authenticated before anything else happens: a bearer JWT in the
``authorization`` metadata (verified with PyJWT: signature by the configured key in one of
the allowed algorithms, issuer, audience, expiry; ``alg=none`` is refused when the config
is read and again by PyJWT), an API key in ``x-api-key`` (the key file holds only SHA-256
hashes), or a TLS client certificate verified against the configured CA (the principal is
its common name). The principal then maps to the organizations and agents it may act for;
a request for any other pair is denied. The authorized `Scope` that comes out of here, not
the request's fields, is what retrieval runs under (`ctxcore.service.server`).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from .._files import read_utf8
from ..errors import ConfigError
from ..memory import Scope
from .algorithms import check_jwt_algorithms
from .config import BOM, AuthConfig, ClientAuth, Grant, JwtConfig
from .errors import ServiceError
from .wire import API_KEY_HEADER, AUTHORIZATION_HEADER

__all__ = [
    "API_KEY_HEADER",
    "AUTHORIZATION_HEADER",
    "AuthMethod",
    "Authenticator",
    "Principal",
    "ServiceError",
    "check_jwt_algorithms",
    "hash_api_key",
    "load_api_key_file",
    "new_api_key",
]

#: HMAC secrets shorter than the hash output make brute force cheaper than the hash
#: (RFC 7518 section 3.2 requires at least the hash size; 32 bytes covers HS256).
MIN_HMAC_SECRET_BYTES = 32
_HASH_PREFIX = "sha256:"
#: Private keys PyJWT may read from ``auth.jwt.key_file``: each verifies with its public key.
_PRIVATE_KEYS = (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey, ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey)


class AuthMethod(enum.StrEnum):
    """How a principal was authenticated."""

    JWT = "jwt"
    API_KEY = "api_key"
    MTLS = "mtls"
    NONE = "none"  #: unauthenticated loopback mode


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller and what it may act for (``grants=None``: anything, only in
    unauthenticated loopback mode)."""

    name: str
    method: AuthMethod
    grants: tuple[Grant, ...] | None

    def authorize(self, organization_id: str, agent_id: str) -> Scope:
        """The scope this principal may retrieve under for the requested pair.

        Raises:
            ServiceError: PERMISSION_DENIED when no grant covers the pair.
        """
        if self.grants is None or any(g.allows(organization_id, agent_id) for g in self.grants):
            return Scope(organization_id, agent_id)
        raise ServiceError(
            grpc.StatusCode.PERMISSION_DENIED,
            f"principal {self.name!r} may not act for organization {organization_id!r} agent {agent_id!r}",
        )


def hash_api_key(key: str) -> str:
    """The form an API key is stored in: ``sha256:`` and the hex digest.

    API keys are 256 random bits (`new_api_key`), so a plain SHA-256 is as strong as a
    password hash here and costs microseconds per call.

    >>> hash_api_key("k")[:14]
    'sha256:8254c32'
    """
    return _HASH_PREFIX + hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_api_key() -> str:
    """A fresh API key: 256 random bits, URL-safe base64.

    >>> len(new_api_key()) >= 43
    True
    """
    return secrets.token_urlsafe(32)


def load_api_key_file(path: Path) -> dict[str, str]:
    """Read ``principal sha256:HEX`` lines (``#`` comments, blank lines skipped).

    Returns:
        digest (hex) -> principal.

    Raises:
        ConfigError: unreadable, a malformed line (named by number), or a digest used twice.
    """
    text = read_utf8(path, ConfigError, what="API key file").removeprefix(BOM)  # else part of a principal
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].startswith(_HASH_PREFIX):
            raise ConfigError(f"{path}:{lineno}: expected 'PRINCIPAL sha256:HEX' (keys are stored hashed, never plain)")
        digest = parts[1][len(_HASH_PREFIX) :].lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ConfigError(f"{path}:{lineno}: not a SHA-256 hex digest")
        if digest in out:
            raise ConfigError(f"{path}:{lineno}: this key hash is already listed for {out[digest]!r}")
        out[digest] = parts[0]
    return out


class _JwtVerifier:
    def __init__(self, cfg: JwtConfig) -> None:
        self.cfg = cfg
        try:
            raw = cfg.key_file.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read auth.jwt.key_file {cfg.key_file}: {exc.strerror or exc}") from None
        self.keys: dict[str, Any] = {}
        for alg in cfg.algorithms:
            if alg.startswith("HS"):
                secret = raw.strip()
                if len(secret) < MIN_HMAC_SECRET_BYTES:
                    raise ConfigError(
                        f"auth.jwt.key_file: an HMAC secret must be at least {MIN_HMAC_SECRET_BYTES} bytes"
                    )
                try:
                    # PyJWT refuses, at every token, a secret that is a PEM or SSH key or
                    # a certificate (a public key must never double as an HMAC secret).
                    jwt.get_algorithm_by_name(alg).prepare_key(secret)
                except jwt.InvalidKeyError:
                    raise ConfigError(
                        f"auth.jwt.key_file {cfg.key_file} holds a PEM or SSH key or a certificate, not an HMAC "
                        f"secret ({alg} needs the shared secret)"
                    ) from None
                self.keys[alg] = secret
                continue
            try:
                key = jwt.get_algorithm_by_name(alg).prepare_key(raw)
            except Exception as exc:  # PyJWT raises several types for unusable keys
                raise ConfigError(f"auth.jwt.key_file {cfg.key_file} is not a {alg} public key: {exc}") from None
            # A private key verifies with its public half: PyJWT's RSA and PSS verifiers
            # cannot use the private key itself (its EC and EdDSA ones can).
            self.keys[alg] = key.public_key() if isinstance(key, _PRIVATE_KEYS) else key

    def verify(self, token: str) -> str:
        try:
            alg = jwt.get_unverified_header(token).get("alg")
        except jwt.PyJWTError:
            raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, "bearer token is not a JWT") from None
        if not isinstance(alg, str) or alg not in self.keys:
            raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, "bearer token algorithm is not allowed")
        c = self.cfg
        try:
            claims = jwt.decode(
                token,
                self.keys[alg],
                algorithms=[alg],
                audience=c.audience,
                issuer=c.issuer,
                leeway=c.leeway_s,
                options={"require": ["exp", "iss", "aud", c.principal_claim]},
            )
        except jwt.ExpiredSignatureError:
            raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, "bearer token has expired") from None
        except jwt.ImmatureSignatureError:
            raise ServiceError(
                grpc.StatusCode.UNAUTHENTICATED,
                "bearer token is not valid yet (its 'nbf' or 'iat' is in the future: check the clocks)",
            ) from None
        except jwt.InvalidAudienceError:
            raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, "bearer token is for another audience") from None
        except jwt.InvalidIssuerError:
            raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, "bearer token is from another issuer") from None
        except jwt.InvalidSignatureError:
            raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, "bearer token signature is invalid") from None
        except jwt.MissingRequiredClaimError as exc:
            raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, f"bearer token lacks the {exc.claim!r} claim") from None
        except jwt.PyJWTError:
            raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, "bearer token is invalid") from None
        name = claims.get(c.principal_claim)
        if not isinstance(name, str):
            raise ServiceError(
                grpc.StatusCode.UNAUTHENTICATED,
                f"bearer token {c.principal_claim!r} claim must be a string, got {type(name).__name__}",
            )
        if not name:
            raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, f"bearer token {c.principal_claim!r} claim is empty")
        return name


class Authenticator:
    """Turns a call's metadata and TLS peer into a `Principal`, or refuses it.

    Built once at start-up from `AuthConfig`: key files are read and checked here, so a
    bad key stops the server instead of failing every call.
    """

    def __init__(self, cfg: AuthConfig) -> None:
        self.cfg = cfg
        self._jwt = _JwtVerifier(cfg.jwt) if cfg.jwt is not None else None
        self._keys = load_api_key_file(cfg.api_key_file) if cfg.api_key_file is not None else None
        self._mtls = cfg.tls is not None and cfg.tls.client_auth is not ClientAuth.NONE
        self._principals: Mapping[str, tuple[Grant, ...]] = dict(cfg.principals)

    @property
    def open(self) -> bool:
        """Unauthenticated loopback mode: every caller may act for anyone."""
        return self.cfg.allow_unauthenticated

    def authenticate(
        self, metadata: Iterable[tuple[str, str | bytes]] | None, auth_context: Mapping[str, Iterable[bytes]] | None
    ) -> Principal:
        """Who is calling.

        Raises:
            ServiceError: UNAUTHENTICATED for missing or bad credentials; PERMISSION_DENIED
                for a valid credential whose principal is granted nothing.
        """
        if self.open:
            return Principal("", AuthMethod.NONE, None)
        md: dict[str, list[str]] = {}
        for k, v in metadata or ():
            if isinstance(v, bytes):
                continue  # binary (-bin) headers never carry our credentials
            md.setdefault(k.lower(), []).append(v)
        if len(md.get(AUTHORIZATION_HEADER, ())) > 1 or len(md.get(API_KEY_HEADER, ())) > 1:
            raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, "more than one credential of the same kind")
        if AUTHORIZATION_HEADER in md:
            if self._jwt is None:
                raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, "bearer tokens are not accepted by this server")
            scheme, _, token = md[AUTHORIZATION_HEADER][0].partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, "authorization must be 'Bearer <JWT>'")
            return self._grant(self._jwt.verify(token.strip()), AuthMethod.JWT)
        if API_KEY_HEADER in md:
            if self._keys is None:
                raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, "API keys are not accepted by this server")
            digest = hashlib.sha256(md[API_KEY_HEADER][0].encode("utf-8")).hexdigest()
            name = None
            for known, principal in self._keys.items():  # constant time in the key's content
                if hmac.compare_digest(known, digest):
                    name = principal
            if name is None:
                raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, "API key is not valid")
            return self._grant(name, AuthMethod.API_KEY)
        if self._mtls and auth_context:
            cn = list(auth_context.get("x509_common_name", ()))
            if cn:
                return self._grant(cn[0].decode("utf-8", "replace"), AuthMethod.MTLS)
        raise ServiceError(
            grpc.StatusCode.UNAUTHENTICATED, "no credentials: send a bearer token, an API key or a client certificate"
        )

    def _grant(self, name: str, method: AuthMethod) -> Principal:
        grants = self._principals.get(name)
        if not grants:
            raise ServiceError(grpc.StatusCode.PERMISSION_DENIED, f"principal {name!r} is granted no organization")
        return Principal(name, method, grants)
