"""Leader election for the reconcilers (reconcile/runner.py checks it at the start of every pass).

SQLite: one controller process owns the file, so it is always the leader.
PostgreSQL: the leader holds a session-level advisory lock on a dedicated connection (no pool, so closing
the connection, or the process dying, releases the lock). Followers try to take it on every pass.
The lock key is derived from the database and schema, so separate fleets (or test runs) in one
PostgreSQL server do not elect each other.
"""

from __future__ import annotations

import logging
from typing import Protocol

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

log = logging.getLogger(__name__)

LOCK_KEY_SQL = "hashtext('fleetctl-leader:' || current_database() || '.' || current_schema())"


class LeaderElection(Protocol):
    def ensure(self) -> bool:
        """Try to be (or stay) leader; True while this process leads."""

    @property
    def is_leader(self) -> bool: ...

    def release(self) -> None: ...


class AlwaysLeader:
    """SQLite: there is only one controller process."""

    is_leader = True

    def ensure(self) -> bool:
        return True

    def release(self) -> None:
        pass


class AdvisoryLockLeader:
    """PostgreSQL advisory-lock leadership, held on one connection for as long as it lives."""

    def __init__(self, engine: Engine):
        self._engine = create_engine(engine.url, poolclass=NullPool)
        self._conn: Connection | None = None
        self._leading = False

    @property
    def is_leader(self) -> bool:
        return self._leading

    def ensure(self) -> bool:
        try:
            conn = self._connection()
            if self._leading:
                conn.execute(text("SELECT 1"))  # the lock lives as long as this session does
            else:
                self._leading = bool(conn.execute(text(f"SELECT pg_try_advisory_lock({LOCK_KEY_SQL})")).scalar())
                if self._leading:
                    log.info("this controller is now the reconcile leader")
            conn.commit()
        except DBAPIError as exc:
            log.warning("leader election: database error (%s); following", type(exc).__name__)
            self._reset()
        return self._leading

    def release(self) -> None:
        """Step down now. The lock is unlocked explicitly: closing the connection frees it too, but only once
        the server's backend has exited, which can be after a follower's next try."""
        if self._leading and self._conn is not None:
            try:
                self._conn.execute(text(f"SELECT pg_advisory_unlock({LOCK_KEY_SQL})"))
                self._conn.commit()
            except DBAPIError as exc:  # the connection is gone already, and with it the lock
                log.warning("leader election: unlocking failed (%s); closing the connection", type(exc).__name__)
        self._reset()
        self._engine.dispose()

    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = self._engine.connect()
        return self._conn

    def _reset(self) -> None:
        if self._leading:
            log.info("this controller is no longer the reconcile leader")
        self._leading = False
        if self._conn is not None:
            try:
                self._conn.close()
            except DBAPIError:
                pass
            self._conn = None


def election_for(engine: Engine) -> LeaderElection:
    return AlwaysLeader() if engine.dialect.name == "sqlite" else AdvisoryLockLeader(engine)
