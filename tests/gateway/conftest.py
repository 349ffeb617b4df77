"""Fixtures of the gateway's process-level tests: `launcher` starts real engines, gateways and controllers
(tests/gateway/procs.py) and stops every one of them, by PID, when the test module ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.procs import Launcher


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    started = Launcher(tmp_path_factory.mktemp("gateway-procs"))
    yield started
    started.stop_all()
