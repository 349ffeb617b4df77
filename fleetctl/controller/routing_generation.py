"""The routing table's generation: a counter in the database (routing_state, one row) that advances
whenever the table's routing-relevant content changes, so "gateway g applied generation >= G" means g
routes on a table that includes every change committed before G was handed out.

Routing-relevant content is the whole table except engines' `metrics` (a live sample that changes on
every heartbeat; gateways probe engines themselves). So equal routing content keeps its generation, and
a heartbeat that only refreshes metrics does not advance it.

The counter is advanced lazily, by whoever next builds the table and finds its digest differs from the
stored one: a gateway's `GET /api/v1/routing`, or a change (`PUT /api/v1/traffic/{model}`) that returns
the generation including itself. Agent heartbeats never write it, so their cost stays their own rows.

Concurrency (PostgreSQL read committed; SQLite, one writer at a time): a first, optimistic pass reads the
stored (generation, digest), then builds the table; equal digests need no write, the common case. Else a
second pass takes the row's write lock first (a no-op UPDATE), then re-reads and rebuilds under it and
advances the counter. A table stamped G' > G is thus always built after G was committed, and nobody can
stamp a generation while another is building under the lock: one generation never names two tables.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fleetctl.controller.models import RoutingState

ROW_ID = 1
UNVERSIONED_ENGINE_FIELDS = ("metrics",)


def content_digest(content: dict[str, Any]) -> str:
    """sha256 of the routing-relevant content: everything but engines' metrics."""
    versioned = {**content, "engines": [
        {k: v for k, v in engine.items() if k not in UNVERSIONED_ENGINE_FIELDS} for engine in content.get("engines", [])]}
    canonical = json.dumps(versioned, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(canonical).hexdigest()


def stamp(session: Session, build: Callable[[], dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """(generation, content) where `content = build()` is the routing table without its generation;
    advances the counter when the content differs from the last stamped one."""
    seen = _read(session)  # first, before the table
    content = build()
    digest = content_digest(content)
    if seen is not None and seen[1] == digest:
        return seen[0], content
    session.flush()
    _lock(session)
    session.expire_all()  # rebuild from the rows as they are now, not the identity map's copies
    seen = _read(session)
    content = build()
    return _advance(session, seen, content_digest(content)), content


def lock(session: Session) -> None:
    """Take the counter row's write lock until the transaction ends, before reading what a change checks:
    writers that must see each other's committed rows (two drill starts for one model) take turns."""
    _lock(session)


def _read(session: Session) -> tuple[int, str] | None:
    row = session.execute(select(RoutingState.generation, RoutingState.digest).where(RoutingState.id == ROW_ID)).first()
    return (int(row[0]), row[1]) if row is not None else None


def _lock(session: Session) -> None:
    """Take the counter row's write lock until the transaction ends (PostgreSQL: the row; SQLite: the
    database), creating the row if the schema was made without the migration that seeds it."""
    locked = session.execute(
        update(RoutingState).where(RoutingState.id == ROW_ID).values(generation=RoutingState.generation)
        .execution_options(synchronize_session=False)
    ).rowcount
    if locked == 0:
        try:
            with session.begin_nested():
                session.execute(insert(RoutingState).values(id=ROW_ID, generation=0, digest=""))
        except IntegrityError:  # created concurrently: lock that one
            _lock(session)


def _advance(session: Session, seen: tuple[int, str] | None, digest: str) -> int:
    generation = seen[0] if seen is not None else 0
    if seen is not None and seen[1] == digest:
        return generation  # someone stamped this content while we waited for the lock
    session.execute(
        update(RoutingState).where(RoutingState.id == ROW_ID).values(generation=generation + 1, digest=digest)
        .execution_options(synchronize_session=False)
    )
    return generation + 1
