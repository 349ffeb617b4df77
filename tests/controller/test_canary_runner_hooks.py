"""The runner's hooks for reconcilers that keep work running between runs (the canary probe executor):
`on_leadership_lost` when a pass finds this process no longer leading, `close` when the runner stops."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session

from fleetctl.controller.reconcile import Result
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.settings import ControllerSettings


class Hooked:
    """A reconciler that counts its runs and the hooks called on it."""

    interval_s = 1.0

    def __init__(self, name: str = "hooked"):
        self.name = name
        self.runs = 0
        self.lost = 0
        self.closed = 0

    def snapshot(self, session: Session, now: datetime) -> None:
        return None

    def decide(self, snapshot: None, now: datetime) -> None:
        return None

    def apply(self, session: Session, decision: None, now: datetime) -> Result[None]:
        self.runs += 1
        return Result(None)

    def on_leadership_lost(self) -> None:
        self.lost += 1

    def close(self) -> None:
        self.closed += 1


def runtime(url: str, tmp_path: Path, name: str, reconciler: Hooked) -> ControllerRuntime:
    settings = ControllerSettings(db_url=url, state_dir=tmp_path / name, background=False)
    started = ControllerRuntime(settings, reconcilers=[reconciler])
    started.start()
    return started


def takes_over(runtime: ControllerRuntime, timeout_s: float = 10.0) -> bool:
    """Passes until it leads: the server frees a closed session's advisory lock shortly after, not at once."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if runtime.runner.run_all().leading:
            return True
        time.sleep(0.05)
    return False


def test_losing_leadership_and_stopping_are_told_to_the_reconcilers(pg_url: str, tmp_path: Path) -> None:
    first, second = Hooked(), Hooked()
    leader, follower = runtime(pg_url, tmp_path, "a", first), runtime(pg_url, tmp_path, "b", second)
    try:
        assert leader.runner.run_all().leading and not follower.runner.run_all().leading
        assert (first.runs, first.lost, second.lost) == (1, 0, 0)  # a follower that never led loses nothing
        leader.election.release()
        assert takes_over(follower)
        assert not leader.runner.run_all().leading
        assert not leader.runner.run_all().leading
        assert (first.lost, second.lost) == (1, 0)  # told once, at the first pass as a follower
    finally:
        follower.stop()
        leader.stop()
    assert (first.closed, second.closed) == (1, 1)


def test_a_hook_that_raises_does_not_stop_the_others(tmp_path: Path) -> None:
    class Broken(Hooked):
        def close(self) -> None:
            raise RuntimeError("cannot close")

    broken, fine = Broken("broken"), Hooked("fine")
    settings = ControllerSettings(db_url=f"sqlite:///{tmp_path / 'fleet.db'}", state_dir=tmp_path / "s", background=False)
    started = ControllerRuntime(settings, reconcilers=[broken, fine])
    started.start()
    started.stop()
    assert fine.closed == 1
