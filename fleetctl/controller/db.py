"""Database engines, sessions and migrations.

SQLite (the embedded default) runs in WAL mode (synchronous=NORMAL) with a busy timeout, so API threads and
the reconcile thread of the one controller process can share it. PostgreSQL (psycopg 3) is for several
controller replicas.
Migrations are Alembic's, in the repository's migrations/ directory; `migrate()` applies them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 10_000


def make_engine(url: str, **kwargs: Any) -> Engine:
    if url.startswith("sqlite"):
        return _sqlite_engine(url, **kwargs)
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 10)
    return create_engine(url, **kwargs)


def _sqlite_engine(url: str, **kwargs: Any) -> Engine:
    path = url.split("///", 1)[-1]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs)

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: a commit appends to the WAL without an fsync (checkpoints still sync). FULL (SQLite's
        # default) fsyncs every commit, which serialises every heartbeat behind the disk (3-8 ms a sync here:
        # ~100-250 beats/s at most, then writers queue on the lock). The database stays consistent after a
        # crash of any kind; an OS crash or power loss (not a controller crash) may lose the last commits, of
        # any kind: a trade for a single-node store (heartbeats are re-sent every interval anyway).
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()

    return engine


class Store:
    """An engine and its session factory. `session()` is a unit of work: commit on success, else roll back."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def from_url(cls, url: str) -> "Store":
        return cls(make_engine(url))

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def close(self) -> None:
        self.engine.dispose()


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def migrate(engine: Engine, revision: str = "head") -> None:
    """Apply migrations up to `revision` on this engine's database (idempotent)."""
    from alembic import command

    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
