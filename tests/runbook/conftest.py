"""A real controller on loopback per test for the runbook CLI tests (SQLite, and PostgreSQL when
FLEET_TEST_PG_URL is set): the same fixture as tests/cli's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.controller.server import ServerThread
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import PG_URL_ENV, pg_test_schema, role_tokens
from tests.cli.cli_helpers import Fleet


@pytest.fixture(params=["sqlite", "postgresql"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    if request.param == "sqlite":
        yield from _fleet(f"sqlite:///{tmp_path / 'fleet.db'}", tmp_path)
        return
    if not os.environ.get(PG_URL_ENV):
        pytest.skip(f"PostgreSQL tests need {PG_URL_ENV}")
    with pg_test_schema(os.environ[PG_URL_ENV]) as url:
        yield from _fleet(url, tmp_path)


def _fleet(db_url: str, tmp_path: Path) -> Iterator[Fleet]:
    settings = ControllerSettings(db_url=db_url, state_dir=tmp_path / "state", port=0,
                                  heartbeat_interval_s=0.2, down_after_s=60, reconcile_interval_s=0.1)
    with ServerThread(settings) as server:
        yield Fleet(server, role_tokens(server.runtime.store))
