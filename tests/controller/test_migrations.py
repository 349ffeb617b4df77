"""Migrations: upgrade from an empty database on SQLite and PostgreSQL, idempotently, and the models
agree with the migrations (alembic's autogenerate comparison finds no difference)."""

from __future__ import annotations

import functools
import subprocess

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from fleetctl.controller import testing
from fleetctl.controller.db import alembic_config, current_revision, make_engine, migrate
from fleetctl.controller.models import Base


def head() -> str:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def test_upgrade_from_empty_reaches_head_and_matches_the_models(empty_db_url: str) -> None:
    engine = make_engine(empty_db_url)
    try:
        assert inspect(engine).get_table_names() == []
        migrate(engine)
        migrate(engine)  # a second start is a no-op
        assert current_revision(engine) == head()
        assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
        assert diff == []
    finally:
        engine.dispose()


def test_one_head() -> None:
    assert len(ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()) == 1


def test_the_tests_migrated_copy_is_at_head_and_matches_the_models(db_url: str) -> None:
    """`db_url` is a copy of a database migrated once per worker (pg_dump's script on PostgreSQL): the copy
    must be what the migrations make."""
    engine = make_engine(db_url)
    try:
        assert current_revision(engine) == head()
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
        assert diff == []
        migrate(engine)  # a controller's start finds nothing to do
        assert current_revision(engine) == head()
    finally:
        engine.dispose()


def test_without_a_working_pg_dump_a_migrated_schema_is_migrated_by_the_controller(
        pg_base: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pg_dump that fails (e.g. older than the server) costs time, not tests: the schema is handed out
    empty and migrating it reaches head."""

    def failing_dump(command: list[str], **_kwargs: object) -> None:
        raise subprocess.CalledProcessError(1, command, stderr="pg_dump: error: server version mismatch")

    monkeypatch.setattr(testing.subprocess, "run", failing_dump)
    monkeypatch.setattr(testing, "_pg_migrated_script", functools.cache(testing._pg_migrated_script.__wrapped__))
    with testing.pg_test_schema(pg_base, migrated=True) as url:
        engine = make_engine(url)
        try:
            assert inspect(engine).get_table_names() == []
            migrate(engine)
            assert current_revision(engine) == head()
        finally:
            engine.dispose()
