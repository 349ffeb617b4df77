"""Helpers for tests of anything that needs a real controller (controller, CLI, agent, gateway tests).

    with pg_test_schema(os.environ["FLEET_TEST_PG_URL"]) as url:   # an isolated, dropped-after schema
        settings = ControllerSettings(db_url=url, state_dir=tmp_path, background=False)
        runtime = ControllerRuntime(settings); runtime.start()
        tokens = role_tokens(runtime.store)                          # {"viewer": ..., "operator": ..., ...}
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from fleetctl.controller.auth import ROLES
from fleetctl.controller.db import Store
from fleetctl.controller.tokens import create_token

PG_URL_ENV = "FLEET_TEST_PG_URL"


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


def schema_url(base_url: str, schema: str) -> str:
    """`base_url` with every connection's search_path set to `schema`."""
    url = make_url(base_url)
    return url.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)


@contextmanager
def pg_test_schema(base_url: str) -> Iterator[str]:
    """A new, empty PostgreSQL schema for one test run (so parallel runs never collide); dropped after."""
    schema = f"fleet_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url, poolclass=NullPool)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        yield schema_url(base_url, schema)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


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
