"""Fixtures: every store/API test runs on SQLite and on the real PostgreSQL (FLEET_TEST_PG_URL; skipped
with a reason when unset). Each PostgreSQL test gets its own schema, dropped afterwards.

`db_url` is a database already at head (a copy of one migrated once per worker); `empty_db_url` an empty one,
for the tests of the migrations themselves."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from ctl_helpers import Api, Clock
from fastapi.testclient import TestClient

from fleetctl.controller.api.app import create_app
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import PG_URL_ENV, migrated_sqlite, pg_test_schema, role_tokens


def pg_base_url() -> str:
    url = os.environ.get(PG_URL_ENV)
    if not url:
        pytest.skip(f"PostgreSQL tests need {PG_URL_ENV} (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test)")
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield migrated_sqlite(tmp_path / "fleet.db")
        return
    with pg_test_schema(pg_base_url(), migrated=True) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fleet.db'}"
        return
    with pg_test_schema(pg_base_url()) as url:
        yield url


@pytest.fixture
def pg_base() -> str:
    """The PostgreSQL server's URL itself (skipped when unset), for a test that makes its own schemas."""
    return pg_base_url()


@pytest.fixture
def pg_url() -> Iterator[str]:
    with pg_test_schema(pg_base_url()) as url:
        yield url


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> ControllerSettings:
    return ControllerSettings(db_url=db_url, state_dir=tmp_path / "state", background=False, heartbeat_interval_s=5.0)


@pytest.fixture
def api(settings: ControllerSettings) -> Iterator[Api]:
    clock = Clock()
    runtime = ControllerRuntime(settings, clock=clock)
    with TestClient(create_app(runtime=runtime)) as http:
        yield Api(http, runtime, role_tokens(runtime.store), clock)
