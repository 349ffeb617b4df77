"""The reconciler runtime: several reconcilers, each on its own cadence, run by the leader only; a run may ask
to be requeued sooner or later; a wake runs them all at once; one that raises is rolled back, counted,
backed off, and never stops the others; runs, errors and durations are exported at GET /metrics.

Time is injected (the runtime's `clock` and `timer` move only when a test advances them). The toy
reconcilers keep their state in the store (a feature flag counting their successful runs), so every
assertion is on the state of the world.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from ctl_helpers import Api, apply_class, deploy, register
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller.api.app import create_app
from fleetctl.controller.models import FeatureFlag
from fleetctl.controller.reconcile import ReconcileRunner, Result
from fleetctl.controller.reconcile.schedule import MAX_BACKOFF_S, Schedule, after_failure, after_success, backoff_s
from fleetctl.controller.reconciler import PLACEMENT, PlacementReconciler
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.settings import ControllerSettings


class FakeTime:
    """The wall clock (`now`, what reconcilers decide with) and the monotonic timer (what schedules them),
    moved together by `advance`."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=timezone.utc)
        self.ticks = 1000.0

    def __call__(self) -> datetime:
        return self.now

    def monotonic(self) -> float:
        return self.ticks

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        self.ticks += seconds


@dataclass
class Counter:
    """A toy reconciler: each run adds one to the flag `<name>-runs`. `fail` makes `apply` raise after
    writing, so a failed run must leave no trace; `requeue_after` is what every run asks for."""

    name: str
    interval_s: float
    requeue_after: float | None = None
    fail: bool = False
    wake_once: bool = False  # the first run asks to wake the others (Result.wake)

    def snapshot(self, session: Session, now: datetime) -> int:
        row = session.get(FeatureFlag, f"{self.name}-runs")  # the flags table as a scratch counter store
        return int(row.value) if row is not None else 0

    def decide(self, snapshot: int, now: datetime) -> int:
        return snapshot + 1

    def apply(self, session: Session, decision: int, now: datetime) -> Result[int]:
        row = session.get(FeatureFlag, f"{self.name}-runs")
        if row is None:
            session.add(FeatureFlag(name=f"{self.name}-runs", value=decision, updated_at=now, updated_by="test"))
        else:
            row.value = decision
        session.flush()
        if self.fail:
            raise RuntimeError(f"{self.name} is broken")
        return Result(decision, changed=True, requeue_after=self.requeue_after, wake=self.wake_once and decision == 1)


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def make_runtime(tmp_path: Path, fake_time: FakeTime) -> Iterator[Callable[..., ControllerRuntime]]:
    """Started runtimes on `url` running `reconcilers`, on the fake time, stopped after the test."""
    started: list[ControllerRuntime] = []

    def make(url: str, *reconcilers: Counter | PlacementReconciler) -> ControllerRuntime:
        settings = ControllerSettings(db_url=url, state_dir=tmp_path / f"state-{len(started)}", background=False)
        runtime = ControllerRuntime(settings, clock=fake_time, reconcilers=reconcilers, timer=fake_time.monotonic)
        runtime.start()
        started.append(runtime)
        return runtime

    yield make
    for runtime in started:
        runtime.stop()


def runs(runtime: ControllerRuntime) -> dict[str, int]:
    """Each toy reconciler's successful runs, as stored."""
    with runtime.store.session() as session:
        rows = session.execute(select(FeatureFlag)).scalars()
        return {r.name.removesuffix("-runs"): r.value for r in rows if r.name.endswith("-runs")}


def ran(runner: ReconcileRunner) -> list[str]:
    """The reconcilers one pass of `runner.run_due()` ran (successfully or not)."""
    report = runner.run_due()
    return sorted([*report.results, *report.errors])


def samples(text: str) -> dict[tuple[str, str], float]:
    """(sample name, reconciler label) -> value, from a Prometheus text exposition."""
    return {(s.name, s.labels.get("reconciler", "")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


# --- schedules, as pure functions ---


def test_backoff_doubles_from_the_interval_up_to_the_cap() -> None:
    assert [backoff_s(n, 2.0) for n in (1, 2, 3, 4, 5, 6, 7)] == [2.0, 4.0, 8.0, 16.0, 32.0, MAX_BACKOFF_S, MAX_BACKOFF_S]
    assert backoff_s(1, 600.0) == 600.0  # a reconciler slower than the cap retries at its own interval
    assert backoff_s(10_000, 1.0) == MAX_BACKOFF_S


def test_a_success_resets_the_failures_and_honours_requeue_after() -> None:
    failed = after_failure(after_failure(Schedule(interval_s=5.0), 100.0), 105.0)
    assert (failed.failures, failed.next_run_at) == (2, 115.0)
    assert after_success(failed, 120.0, None) == Schedule(5.0, next_run_at=125.0, failures=0)
    assert after_success(failed, 120.0, 0.5).next_run_at == 120.5
    assert after_success(failed, 120.0, 600.0).next_run_at == 720.0


# --- the runner, on the real store ---


def test_each_reconciler_runs_at_its_own_cadence(db_url: str, make_runtime, fake_time: FakeTime) -> None:
    runtime = make_runtime(db_url, Counter("fast", interval_s=1.0), Counter("slow", interval_s=5.0))
    timeline = []
    for _ in range(6):
        timeline.append(ran(runtime.runner))
        fake_time.advance(1.0)
    assert timeline == [["fast", "slow"], ["fast"], ["fast"], ["fast"], ["fast"], ["fast", "slow"]]
    assert runs(runtime) == {"fast": 6, "slow": 2}


def test_requeue_after_is_honoured_sooner_or_later_than_the_interval(db_url: str, make_runtime, fake_time: FakeTime) -> None:
    runtime = make_runtime(db_url, Counter("soon", interval_s=10.0, requeue_after=3.0),
                           Counter("paused", interval_s=2.0, requeue_after=30.0))
    assert ran(runtime.runner) == ["paused", "soon"]
    fake_time.advance(2.9)
    assert ran(runtime.runner) == []  # neither runs at its interval: each asked for another time
    fake_time.advance(0.1)
    assert ran(runtime.runner) == ["soon"]
    fake_time.advance(27.0)
    assert ran(runtime.runner) == ["paused", "soon"]
    assert runs(runtime) == {"soon": 3, "paused": 2}


def test_a_wake_runs_every_reconciler_at_once(db_url: str, make_runtime, fake_time: FakeTime) -> None:
    runtime = make_runtime(db_url, Counter("fast", interval_s=1.0), Counter("paused", interval_s=1.0, requeue_after=600.0))
    assert ran(runtime.runner) == ["fast", "paused"]
    assert ran(runtime.runner) == []
    runtime.wake()  # e.g. a deployment changed through the API
    assert ran(runtime.runner) == ["fast", "paused"]
    assert ran(runtime.runner) == []  # the wake was taken by that pass
    assert runs(runtime) == {"fast": 2, "paused": 2}


def test_a_run_that_asks_to_wake_runs_every_reconciler_in_the_next_pass(db_url: str, make_runtime,
                                                                          fake_time: FakeTime) -> None:
    runtime = make_runtime(db_url, Counter("placement", interval_s=600.0),
                           Counter("scaler", interval_s=600.0, wake_once=True))
    assert ran(runtime.runner) == ["placement", "scaler"]  # the scaler's first run changed placement's input
    assert ran(runtime.runner) == ["placement", "scaler"]  # so both run again at once, not in ten minutes
    assert ran(runtime.runner) == []  # no more wakes asked for
    assert runs(runtime) == {"placement": 2, "scaler": 2}


def test_an_erroring_reconciler_is_isolated_counted_and_backed_off(db_url: str, make_runtime, fake_time: FakeTime) -> None:
    broken = Counter("broken", interval_s=1.0, fail=True)
    runtime = make_runtime(db_url, broken, Counter("healthy", interval_s=1.0))
    report = runtime.runner.run_due()
    assert list(report.results) == ["healthy"] and str(report.errors["broken"]) == "broken is broken"
    assert runs(runtime) == {"healthy": 1}  # the failed run's write was rolled back

    timeline = []
    for _ in range(7):
        fake_time.advance(1.0)
        timeline.append("broken" in ran(runtime.runner))
    # retried after 1 s, then 2 s, then 4 s (backoff from its 1 s interval)
    assert timeline == [True, False, True, False, False, False, True]
    assert runtime.runner.schedule("broken").failures == 4
    assert runs(runtime) == {"healthy": 8}  # the healthy one ran every second throughout

    broken.fail = False
    runtime.wake()
    assert ran(runtime.runner) == ["broken", "healthy"]
    assert runtime.runner.schedule("broken").failures == 0
    fake_time.advance(1.0)
    assert ran(runtime.runner) == ["broken", "healthy"]  # back on its interval
    metrics = samples(runtime.metrics.exposition().decode())
    assert metrics[("fleet_controller_reconcile_runs_total", "broken")] == 6
    assert metrics[("fleet_controller_reconcile_errors_total", "broken")] == 4
    assert metrics[("fleet_controller_reconcile_errors_total", "healthy")] == 0
    assert metrics[("fleet_controller_reconcile_duration_seconds_count", "healthy")] == 10


def test_step_runs_every_reconciler_and_reports_placement(db_url: str, make_runtime, fake_time: FakeTime) -> None:
    runtime = make_runtime(db_url, PlacementReconciler(down_after_s=15.0, interval_s=2.0), Counter("other", interval_s=60.0))
    assert runtime.step().changed == [] and runtime.step().changed == []  # due or not, each step runs them all
    assert runs(runtime) == {"other": 2} and runtime.passes == 2


def test_step_raises_a_placement_failure_after_the_others_ran(db_url: str, make_runtime) -> None:
    failing = Counter(PLACEMENT, interval_s=2.0, fail=True)
    runtime = make_runtime(db_url, Counter("first", interval_s=2.0), failing, Counter("last", interval_s=2.0))
    with pytest.raises(RuntimeError, match="placement is broken"):
        runtime.step()
    assert runs(runtime) == {"first": 1, "last": 1}


def test_only_the_leader_runs_reconcilers(pg_url: str, make_runtime) -> None:
    leader = make_runtime(pg_url, Counter("tick", interval_s=1.0))
    follower = make_runtime(pg_url, Counter("tick", interval_s=1.0))
    assert leader.runner.run_due().leading
    follower.wake()
    report = follower.runner.run_due()
    assert (report.leading, report.results, report.errors) == (False, {}, {})
    assert runs(leader) == {"tick": 1}
    assert samples(follower.metrics.exposition().decode())[("fleet_controller_reconcile_runs_total", "tick")] == 0

    leader.election.release()  # the leader goes away: the follower takes over on its next pass
    assert follower.runner.run_due().results["tick"].report == 2
    assert runs(follower) == {"tick": 2}


def test_reconcile_metrics_are_served_at_slash_metrics_without_auth(api: Api) -> None:
    register(api, "n1")
    deploy(api, "chat", apply_class(api)["ref"], 1)
    api.reconcile()
    api.reconcile()
    response = api.call("GET", "/metrics", role=None)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    metrics = samples(response.text)
    assert metrics[("fleet_controller_reconcile_runs_total", PLACEMENT)] == 2
    assert metrics[("fleet_controller_reconcile_errors_total", PLACEMENT)] == 0
    assert metrics[("fleet_controller_reconcile_duration_seconds_count", PLACEMENT)] == 2


def test_a_fresh_controller_exports_every_reconciler_at_zero(db_url: str, tmp_path: Path) -> None:
    settings = ControllerSettings(db_url=db_url, state_dir=tmp_path / "state", background=False)
    with TestClient(create_app(settings)) as http:
        metrics = samples(http.get("/metrics").text)
    assert metrics[("fleet_controller_reconcile_runs_total", PLACEMENT)] == 0
    assert metrics[("fleet_controller_reconcile_errors_total", PLACEMENT)] == 0


def test_the_background_loop_runs_them_and_a_wake_reruns_them_before_their_interval(db_url: str, tmp_path: Path) -> None:
    settings = ControllerSettings(db_url=db_url, state_dir=tmp_path / "state", background=True)
    runtime = ControllerRuntime(settings, reconcilers=[Counter("hourly", interval_s=3600.0)])
    runtime.start()
    try:
        wait_for(lambda: runs(runtime) == {"hourly": 1})  # the first pass runs at start
        runtime.wake()
        wait_for(lambda: runs(runtime) == {"hourly": 2})  # long before the hour is up
    finally:
        runtime.stop()


def wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll for something the background thread does (a bound on a hang, not a speed assertion)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the background loop did not get there"
        time.sleep(0.02)
