"""Client API keys: who may call the gateway, and how fast. Separate from the controller's operator tokens.

Keys come from a file (`--api-keys-file`) and/or an environment variable (FLEET_GATEWAY_API_KEYS), one key
per line (the variable may also separate them with commas):

    name:key:rps        # e.g. "batch-team:sk-abc123:5"; rps 0 or missing = unlimited; '#' starts a comment
    name:key:rps:probe  # e.g. "canary:sk-probe:0:probe": a key the controller's canary probes use

No key configured = the gateway is open. Otherwise /v1/* and /fleet/* need `Authorization: Bearer <key>`, and
only a probe key may mark a request as a canary probe (`x-fleet-probe`, which keeps it out of the user-facing
metrics and lets it pin an engine): any other key doing so is refused with a 403. (An open gateway cannot
tell its callers apart, so there anyone may.)
Keys are compared in constant time (sha256 digests compared with hmac.compare_digest against every key, no
early exit) and never logged: logs and metrics carry the key's name. Each key has a token bucket of `rps`
tokens per second holding at most max(1, rps) tokens, so a short burst of one second's worth passes.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from fleetctl.gateway.errors import TooManyRequests, Unauthorized

API_KEYS_ENV = "FLEET_GATEWAY_API_KEYS"


@dataclass
class TokenBucket:
    """`rate` tokens per second, at most `capacity`; `take()` is the wait in seconds (0: allowed now)."""

    rate: float
    capacity: float
    clock: Callable[[], float] = time.monotonic
    tokens: float = field(init=False)
    updated: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.capacity
        self.updated = self.clock()

    def take(self) -> float:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


@dataclass
class ClientKey:
    name: str
    digest: bytes = field(repr=False)
    rps: float  # 0: unlimited
    bucket: TokenBucket | None = field(default=None, repr=False)
    probes: bool = False  # may send canary probes (x-fleet-probe)


class KeySpec(NamedTuple):
    """One configured key, as read from a line."""

    name: str
    key: str
    rps: float
    probes: bool = False


PROBE_FLAG = "probe"  # the 4th field of a probe key's line


def parse_key_lines(lines: Iterable[str], source: str) -> list[KeySpec]:
    """One KeySpec per non-blank, non-comment line. ValueError names the source and line number, never the key."""
    keys = []
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split(":")
        if len(parts) not in (2, 3, 4) or not parts[0].strip() or not parts[1].strip():
            raise ValueError(f"{source} line {number}: expected name:key[:rps[:probe]]")
        try:
            rps = float(parts[2]) if len(parts) >= 3 and parts[2].strip() else 0.0
        except ValueError:
            raise ValueError(f"{source} line {number}: rps must be a number") from None
        if rps < 0 or math.isnan(rps):
            raise ValueError(f"{source} line {number}: rps must be >= 0")
        if len(parts) == 4 and parts[3].strip() != PROBE_FLAG:
            raise ValueError(f"{source} line {number}: the 4th field may only be {PROBE_FLAG!r}")
        keys.append(KeySpec(parts[0].strip(), parts[1].strip(), rps, len(parts) == 4))
    return keys


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyRing:
    """The configured keys. `check(authorization)` returns the caller's key name, or raises 401 / 429."""

    def __init__(self, keys: Iterable[tuple[str, str, float] | KeySpec], clock: Callable[[], float] = time.monotonic):
        self._keys: list[ClientKey] = []
        names: set[str] = set()
        for spec in keys:
            name, key, rps, probes = KeySpec(*spec)
            if name in names:
                raise ValueError(f"API key name {name!r} appears twice")
            names.add(name)
            bucket = TokenBucket(rps, max(1.0, rps), clock) if rps > 0 else None
            self._keys.append(ClientKey(name, _digest(key), rps, bucket, probes))

    @property
    def open(self) -> bool:
        return not self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def identify(self, authorization: str | None) -> ClientKey:
        """The key the header carries; Unauthorized if none matches."""
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        digest = _digest(given.strip())
        found = None
        for key in self._keys:  # every key is compared: the time taken does not depend on which one matched
            if hmac.compare_digest(digest, key.digest):
                found = key
        if found is None:
            raise Unauthorized("invalid API key")
        return found

    def may_probe(self, key: ClientKey | None) -> bool:
        """Whether the caller (its identified key; None on an open gateway) may send canary probes; on an open
        gateway anyone may."""
        return self.open or (key is not None and key.probes)

    @staticmethod
    def throttle(key: ClientKey) -> None:
        """Take one request from the key's bucket; TooManyRequests (with Retry-After) when it is empty."""
        if key.bucket is None:
            return
        wait = key.bucket.take()
        if wait > 0:
            raise TooManyRequests(
                f"rate limit of {key.rps:g} requests/s for key {key.name!r} exceeded", retry_after_s=max(1, math.ceil(wait))
            )

    def check(self, authorization: str | None) -> str | None:
        """The caller's key name (None when the gateway is open); raises Unauthorized or TooManyRequests."""
        if self.open:
            return None
        key = self.identify(authorization)
        self.throttle(key)
        return key.name


def load_key_ring(path: Path | None, env_value: str | None) -> KeyRing:
    keys: list[KeySpec] = []
    if path is not None:
        keys += parse_key_lines(path.read_text().splitlines(), str(path))
    if env_value:
        keys += parse_key_lines(env_value.replace(",", "\n").splitlines(), API_KEYS_ENV)
    return KeyRing(keys)
