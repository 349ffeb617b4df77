"""Fixtures of the rollout process tests (helpers: rollout_fleet.py, rollout_load.py, rollout_api.py).

The SQLite fleet is shared by the live and CLI modules, the others by their module's tests (each leaves it with no rollout running and all traffic on one
revision); every process it started is stopped by PID when the module ends.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from rollout_fleet import FleetOptions, RolloutFleet, start_fleet, stop_fleet

from fleetctl.controller.testing import PG_URL_ENV, pg_test_schema


@contextmanager
def running_fleet(state_dir: Path, options: FleetOptions) -> Iterator[RolloutFleet]:
    fleet = start_fleet(state_dir, options)
    try:
        yield fleet
    finally:
        stop_fleet(fleet)


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutFleet]:
    """SQLite controller, two agents, a gateway; A: two mixed engines with all the traffic."""
    with running_fleet(tmp_path_factory.mktemp("rollout-fleet"), FleetOptions()) as started:
        yield started


@pytest.fixture(scope="module")
def pg_base_url() -> str:
    url = os.environ.get(PG_URL_ENV)
    if not url:
        pytest.skip(f"PostgreSQL tests need {PG_URL_ENV} (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test)")
    return url


@pytest.fixture(scope="module")
def pg_fleet(tmp_path_factory: pytest.TempPathFactory, pg_base_url: str) -> Iterator[RolloutFleet]:
    """Two controllers on one PostgreSQL schema (controller-0 leads; everything else talks to controller-1)."""
    with pg_test_schema(pg_base_url) as url:
        options = FleetOptions(controllers=2, db_url=url)
        with running_fleet(tmp_path_factory.mktemp("rollout-pg-fleet"), options) as started:
            yield started


@pytest.fixture(scope="module")
def pd_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutFleet]:
    """A served P/D: one prefill and one decode engine."""
    options = FleetOptions(roles=("prefill", "decode"), replicas=1)
    with running_fleet(tmp_path_factory.mktemp("rollout-pd-fleet"), options) as started:
        yield started
