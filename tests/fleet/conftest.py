"""Fixtures of the process-level tests (helpers: fleet_helpers.py).

Every process a test starts is stopped by PID at teardown (`down` reads fleet.json and the agents' engine
records), whatever the test did to it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fleet_helpers import start_tiny_fleet

from fleetctl.localfleet import FleetRecord, down


@pytest.fixture(scope="module")
def tiny_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetRecord]:
    """Two agents, one tiny engine each, shared by a module's tests (each leaves it converged)."""
    state_dir = tmp_path_factory.mktemp("fleet")
    record = start_tiny_fleet(state_dir)
    yield record
    down(state_dir, timeout_s=30.0)
