"""Which JWT signature algorithms the service accepts: the check that keeps forgery out
of a configuration (no ``none``, no mixing HMAC with public-key algorithms)."""

from __future__ import annotations

from collections.abc import Iterable

import jwt

from ..errors import ConfigError

__all__ = ["check_jwt_algorithms"]


def check_jwt_algorithms(algorithms: Iterable[str]) -> None:
    """Reject algorithm lists that make forgery possible.

    Raises:
        ConfigError: ``none`` (any case), an algorithm PyJWT does not implement, or
            symmetric and asymmetric algorithms mixed (a public key must never double as
            an HMAC secret).

    >>> check_jwt_algorithms(["RS256", "none"])
    Traceback (most recent call last):
    ...
    ctxcore.ConfigError: auth.jwt.algorithms must not contain 'none': unsigned tokens are never accepted
    """
    algs = list(algorithms)
    if any(a.lower() == "none" for a in algs):
        raise ConfigError("auth.jwt.algorithms must not contain 'none': unsigned tokens are never accepted")
    known = set(jwt.algorithms.get_default_algorithms()) - {"none"}
    bad = [a for a in algs if a not in known]
    if bad:
        raise ConfigError(f"auth.jwt.algorithms: unknown {bad} (PyJWT implements {sorted(known)})")
    hs = {a.startswith("HS") for a in algs}
    if len(hs) > 1:
        raise ConfigError("auth.jwt.algorithms must be all HMAC (HS*) or all public-key, not both")
