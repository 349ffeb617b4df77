"""Helpers for tests of anything that needs a real controller (controller, CLI, agent, gateway tests).

    with pg_test_schema(os.environ["FLEET_TEST_PG_URL"]) as url:   # an isolated, dropped-after schema
        settings = ControllerSettings(db_url=url, state_dir=tmp_path, background=False)
        runtime = ControllerRuntime(settings); runtime.start()
        tokens = role_tokens(runtime.store)                          # {"viewer": ..., "operator": ..., ...}

A test that starts a controller on a new database pays for the migrations (70 ms on SQLite, 150 ms on
PostgreSQL) unless it starts from `migrated_sqlite` / `pg_test_schema(..., migrated=True)`: a copy of a
database migrated once per process, which the controller's own start then finds at head.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from functools import cache
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from fleetctl.controller.auth import ROLES
from fleetctl.controller.db import Store, make_engine, migrate
from fleetctl.controller.tokens import create_token

PG_URL_ENV = "FLEET_TEST_PG_URL"

log = logging.getLogger(__name__)


def role_tokens(store: Store, prefix: str = "test") -> dict[str, str]:
    """One fresh token per role (viewer, operator, admin, agent), named `<prefix>-<role>`: role -> token."""
    now = datetime.now(timezone.utc)
    suffix = uuid.uuid4().hex[:6]
    issued = {}
    with store.session() as session:
        for role in ROLES:
            _, token = create_token(session, f"{prefix}-{role}-{suffix}", role, "test", now)
            issued[role] = token
    return issued


def schema_url(base_url: str, schema: str, durable: bool = True) -> str:
    """`base_url` with every connection's search_path set to `schema`; not `durable`: its commits do not wait
    for the WAL flush (a test's data need not outlive a server crash; every commit is still atomic and visible)."""
    options = f"-csearch_path={schema}" + ("" if durable else " -csynchronous_commit=off")
    return make_url(base_url).update_query_dict({"options": options}).render_as_string(hide_password=False)


@contextmanager
def pg_test_schema(base_url: str, migrated: bool = False, durable: bool = False) -> Iterator[str]:
    """A new PostgreSQL schema for one test run (so parallel runs never collide), empty or (`migrated`) at
    head; dropped after. Not `durable` by default (see schema_url): a benchmark of the store asks for it."""
    with _new_schema(base_url, _pg_migrated_script(base_url) if migrated else None) as schema:
        yield schema_url(base_url, schema, durable)


@contextmanager
def _new_schema(base_url: str, script: str | None) -> Iterator[str]:
    schema = f"fleet_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url, poolclass=NullPool, connect_args={"options": "-csynchronous_commit=off"})
    try:
        with admin.begin() as conn:
            if script is None:
                conn.execute(text(f'CREATE SCHEMA "{schema}"'))
            else:  # one round trip of plain DDL; the script creates the schema itself
                conn.exec_driver_sql(script.replace(_TEMPLATE_SCHEMA, schema))
        yield schema
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


def migrated_sqlite(path: Path) -> str:
    """The URL of a SQLite database at `path`, at head: a copy of one migrated once in this process."""
    shutil.copyfile(_sqlite_template(), path)
    return f"sqlite:///{path}"


@cache
def _sqlite_template() -> Path:
    path = Path(tempfile.mkdtemp(prefix="fleet-template-")) / "fleet.db"
    engine = make_engine(f"sqlite:///{path}")
    try:
        migrate(engine)
    finally:
        engine.dispose()
    return path


_TEMPLATE_SCHEMA = f"fleet_template_{uuid.uuid4().hex[:12]}"


@cache
def _pg_migrated_script(base_url: str) -> str | None:
    """pg_dump's script of a schema migrated to head, named _TEMPLATE_SCHEMA (None without a working pg_dump:
    the caller then hands out an empty schema and the controller migrates it)."""
    if shutil.which("pg_dump") is None:
        return None
    with _new_schema(base_url, None) as schema:
        engine = make_engine(schema_url(base_url, schema))
        try:
            migrate(engine)
        finally:
            engine.dispose()
        command = ["pg_dump", "--inserts", "--no-owner", "--no-privileges", "-n", schema, *_pg_dump_target(base_url)]
        password = make_url(base_url).password
        env = {**os.environ, "PGPASSWORD": str(password)} if password else None
        try:
            dumped = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
        except (OSError, subprocess.CalledProcessError) as exc:  # e.g. a pg_dump older than the server
            log.warning("pg_dump failed (%s): test schemas will be migrated one by one", exc)
            return None
    # psql meta-commands (\restrict ...) are not SQL
    lines = [line for line in dumped.splitlines() if not line.startswith("\\")]
    return "\n".join(lines).replace(schema, _TEMPLATE_SCHEMA)


def _pg_dump_target(base_url: str) -> list[str]:
    url = make_url(base_url)
    args = ["-h", url.host or "127.0.0.1", "-p", str(url.port or 5432), "-U", url.username or "postgres"]
    return [*args, url.database or "postgres"]


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Wait until the controller process at `url` answers /healthz; fail at once if it exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = process.stderr.read() if process.stderr else ""
            raise AssertionError(f"controller exited with {process.returncode}: {output}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"controller at {url} did not become healthy in {timeout_s:.0f} s")
