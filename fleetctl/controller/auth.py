"""Bearer-token authentication and role checks.

Roles: viewer (read) < operator (change the fleet) < admin (break-glass, tokens). `agent` is a separate
kind that may only call /api/v1/agents/*; admin may call those too (break-glass, and local setups that
run agents with the bootstrap token). Only the sha256 of a token is stored; the lookup is by digest and
the match is confirmed with hmac.compare_digest. Tokens are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller.models import ApiToken
from fleetctl.errors import AuthError

VIEWER, OPERATOR, ADMIN, AGENT = "viewer", "operator", "admin", "agent"
ROLES = (VIEWER, OPERATOR, ADMIN, AGENT)
_RANK = {VIEWER: 1, OPERATOR: 2, ADMIN: 3}
ENV_TOKEN_NAME = "bootstrap-env"
UNAUTHENTICATED = "unauthenticated"


@dataclass(frozen=True)
class Principal:
    name: str
    role: str


def allows(have: str, need: str) -> bool:
    """Whether a token of role `have` may do what needs role `need`."""
    if need == AGENT:
        return have in (AGENT, ADMIN)
    return have in _RANK and _RANK[have] >= _RANK[need]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "fleet_" + secrets.token_urlsafe(32)


def bearer(authorization: str | None) -> str | None:
    """The token in an `Authorization: Bearer <token>` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def identify(session: Session, token: str, env_token_sha256: str | None) -> Principal | None:
    digest = hash_token(token)
    if env_token_sha256 and hmac.compare_digest(digest, env_token_sha256):
        return Principal(ENV_TOKEN_NAME, ADMIN)
    row = session.execute(
        select(ApiToken).where(ApiToken.token_sha256 == digest, ApiToken.revoked_at.is_(None))
    ).scalar_one_or_none()
    if row is not None and hmac.compare_digest(row.token_sha256, digest):
        return Principal(row.name, row.role)
    return None


def authenticate(session: Session, token: str | None, env_token_sha256: str | None) -> Principal:
    if token is None:
        raise AuthError("missing bearer token (Authorization: Bearer <token>)", code="unauthorized")
    principal = identify(session, token, env_token_sha256)
    if principal is None:
        raise AuthError("unknown or revoked token", code="unauthorized")
    return principal


def authorize(principal: Principal, need: str) -> None:
    if not allows(principal.role, need):
        raise AuthError(
            f"this call needs role {need} (token {principal.name!r} has role {principal.role})",
            code="forbidden", status=403,
        )


class TokenCache:
    """Verified tokens, by digest (never the token), for `ttl_s` seconds: the agents' heartbeats and every other
    call then skip the token lookup. Only successes are remembered (a new token works at once); a revocation
    through this controller clears the cache, one through another replica takes effect within `ttl_s`."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self.clock = clock
        self._known: dict[str, tuple[str, Principal, float]] = {}
        self._lock = threading.Lock()

    def get(self, token: str) -> Principal | None:
        if self.ttl_s <= 0:
            return None
        digest = hash_token(token)
        with self._lock:
            entry = self._known.get(digest)
        if entry is None or entry[2] < self.clock() or not hmac.compare_digest(entry[0], digest):
            return None
        return entry[1]

    def put(self, token: str, principal: Principal) -> None:
        if self.ttl_s > 0:
            with self._lock:
                if len(self._known) > 100_000:  # bounded: many distinct tokens only cost lookups
                    self._known.clear()
                digest = hash_token(token)
                self._known[digest] = (digest, principal, self.clock() + self.ttl_s)

    def clear(self) -> None:
        with self._lock:
            self._known.clear()
