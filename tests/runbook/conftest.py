"""A real controller on loopback per test for the runbook CLI tests (SQLite, and PostgreSQL when
FLEET_TEST_PG_URL is set): the same fixture as tests/cli's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.cli.cli_helpers import Fleet, controller_fleet


@pytest.fixture(params=["sqlite", "postgresql"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    yield from controller_fleet(request.param, tmp_path)
