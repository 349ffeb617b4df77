"""A real controller on loopback per test (SQLite, and PostgreSQL when FLEET_TEST_PG_URL is set)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import Fleet, controller_fleet


@pytest.fixture(params=["sqlite", "postgresql"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    yield from controller_fleet(request.param, tmp_path)
