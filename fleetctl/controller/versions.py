"""Optimistic concurrency for the objects operators change (deployments, traffic policies, flags).

Each such row carries `version` (models.Versioned): the ORM checks it on every UPDATE and DELETE, so of two
concurrent writers that read the same version, one commits and the other matches no row and answers 409.
A client that wants "change it only if nobody else did" sends the version it read as `If-Match` (the API
serves it as the ETag); a mismatch is a 409 `version_conflict` that names the current version.
"""

from __future__ import annotations

import re

from fleetctl.controller.models import Versioned
from fleetctl.errors import Conflict, NotFound, ValidationFailed

IF_MATCH = "If-Match"
_ETAG = re.compile(r'^\s*(?:W/)?"?(\d{1,18})"?\s*$')


def etag(version: int) -> str:
    return f'"{version}"'


def parse_if_match(header: str | None) -> int | None:
    """The version an If-Match header names (`"3"`, `W/"3"` or `3`); None when absent."""
    if header is None:
        return None
    match = _ETAG.match(header)
    if not match:
        raise ValidationFailed(f'{IF_MATCH}: must be a version as served in ETag, e.g. "3"', field=IF_MATCH)
    return int(match.group(1))


def check_version(row: Versioned | None, expected: int | None, what: str) -> None:
    """Refuse when the caller named a version (If-Match) and the stored object is at another one."""
    if expected is None:
        return
    if row is None:
        raise NotFound(f"no {what} (If-Match names version {expected})", field=IF_MATCH)
    if row.version != expected:
        raise Conflict(
            f"{what} is at version {row.version}, not {expected}: changed by someone else; re-read it and retry",
            code="version_conflict", field=IF_MATCH,
        )
