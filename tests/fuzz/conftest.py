"""Fixtures of the fuzz tests: real services on loopback (tests/gateway/procs.py starts the processes)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared process helpers

from gateway.procs import Launcher  # noqa: E402

from fleetctl.controller.testing import PG_URL_ENV, migrated_sqlite, pg_test_schema  # noqa: E402


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield migrated_sqlite(tmp_path / "fleet.db")
        return
    if not os.environ.get(PG_URL_ENV):
        pytest.skip(f"PostgreSQL tests need {PG_URL_ENV}")
    with pg_test_schema(os.environ[PG_URL_ENV], migrated=True) as url:
        yield url


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    started = Launcher(tmp_path_factory.mktemp("fuzz-procs"))
    yield started
    started.stop_all()
