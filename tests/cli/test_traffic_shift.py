"""`fleetctl traffic shift`: the plan (pure), the run on fakes and a fake clock (each step stored, then
acknowledged, then the interval), what a Ctrl-C says in each phase, and the command end to end against a
real controller with real gateway loops."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from cli_helpers import Fleet, ok, one_error_line
from traffic_helpers import MODEL, gateway, serving, wait_listed
from typer.testing import CliRunner

from fleetctl.cli import traffic_shift as shift
from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.main import app
from fleetctl.controller.server import free_port

PERFORMANCE_ONLY = {"max_num_seqs": 8}  # chat@r2 differs from chat@r1 in a performance field only


# --- the plan ---

def shares(weights: dict[str, float], to: str, step: float) -> list[float]:
    return [s.share for s in shift.plan_steps(weights, to, step)]


def test_b_rises_by_the_step_until_it_has_everything() -> None:
    assert shares({"chat@r1": 100}, "chat@r2", 30) == [30, 60, 90, 100]
    assert shares({"chat@r1": 9, "chat@r2": 1}, "chat@r2", 25) == [35, 60, 85, 100]  # from its current 10%
    assert shares({"chat@r1": 1}, "chat@r2", 100) == [100]
    assert shares({"chat@r2": 5, "chat@r1": 0}, "chat@r2", 10) == []  # it has all the traffic already
    assert len(shares({"chat@r1": 1}, "chat@r2", 0.1)) == 1000  # no float drift: 0.1 * 1000 is exactly the end


def test_the_others_share_the_rest_in_proportion_and_stay_listed() -> None:
    steps = shift.plan_steps({"chat@r1": 3, "chat@r3": 1}, "chat@r2", 50)
    assert [s.weights for s in steps] == [
        {"chat@r1": 37.5, "chat@r3": 12.5, "chat@r2": 50.0},
        {"chat@r1": 0.0, "chat@r3": 0.0, "chat@r2": 100.0},
    ]
    assert shift.format_shares(steps[0].weights, "chat@r2") == "chat@r2 50%, chat@r1 37.5%, chat@r3 12.5%"


@pytest.mark.parametrize("step", [0, -5, 100.5, 0.01])
def test_a_step_outside_the_range_is_refused(step: float) -> None:
    with pytest.raises(ValueError, match="between 0.1 and 100 percentage points"):
        shift.plan_steps({"chat@r1": 1}, "chat@r2", step)


# --- the run, on fakes ---

class World:
    """Records what the run does, in order, on a fake clock; `interrupt_at` raises KeyboardInterrupt there."""

    def __init__(self, interrupt_at: tuple[str, int] | None = None) -> None:
        self.events: list[tuple[str, Any]] = []
        self.now, self.generation, self.interrupt_at = 0.0, 10, interrupt_at
        self.stored: dict[str, float] = {}

    def _maybe_interrupt(self, what: str, n: int) -> None:
        if self.interrupt_at == (what, n):
            raise KeyboardInterrupt

    def store(self, step: shift.Step) -> int:
        self._maybe_interrupt("store", step.number)
        self.generation += 1
        self.stored = step.weights
        self.events.append(("store", step.share))
        return self.generation

    def acknowledge(self, generation: int) -> dict[str, Any]:
        self._maybe_interrupt("ack", generation)
        self.events.append(("ack", generation))
        return {"gateways": ["gw-a"], "stale": [], "seconds": 0.25}

    def sleep(self, seconds: float) -> None:
        self.events.append(("sleep", seconds))
        self.now += seconds
        self._maybe_interrupt("sleep", len([e for e in self.events if e[0] == "sleep"]))

    def calls(self, lines: list[str]) -> shift.ShiftCalls:
        return shift.ShiftCalls(self.store, self.acknowledge, self.sleep, lines.append)


def start_run(world: World, start: dict[str, float] | None = None, step: float = 40) -> tuple[shift.Position, list[str]]:
    start = start or {"chat@r1": 100.0}
    position = shift.Position(shift.plan_steps(start, "chat@r2", step), start)
    lines: list[str] = []
    try:
        shift.run_shift(position, "chat@r2", 30, world.calls(lines))
    except KeyboardInterrupt:
        pass
    return position, lines


def test_each_step_is_acknowledged_before_the_interval_and_the_next_step() -> None:
    world = World()
    position, lines = start_run(world)
    assert world.events == [("store", 40), ("ack", 11), ("sleep", 30), ("store", 80), ("ack", 12), ("sleep", 30),
                            ("store", 100), ("ack", 13)]  # no wait after the last step
    assert world.now == 60 and position.phase == shift.DONE and position.acknowledged == 3
    assert lines == [
        "step 1/3: chat@r2 40%, chat@r1 60% (generation 11 applied by 1 gateway(s) in 0.2s); next step in 30s",
        "step 2/3: chat@r2 80%, chat@r1 20% (generation 12 applied by 1 gateway(s) in 0.2s); next step in 30s",
        "step 3/3: chat@r2 100% (generation 13 applied by 1 gateway(s) in 0.2s)",
    ]
    assert [r["generation"] for r in position.results] == [11, 12, 13]


def test_a_failed_acknowledgement_stops_before_the_next_step() -> None:
    world = World()

    def timeout(generation: int) -> dict[str, Any]:
        raise TimeoutError(generation)

    position = shift.Position(shift.plan_steps({"chat@r1": 1}, "chat@r2", 40), {"chat@r1": 1})
    with pytest.raises(TimeoutError):
        shift.run_shift(position, "chat@r2", 30, shift.ShiftCalls(world.store, timeout, world.sleep, print))
    assert world.events == [("store", 40)]
    assert (position.current, position.phase, position.acknowledged) == (1, shift.ACKNOWLEDGING, 0)


# --- what a Ctrl-C says ---

def test_interrupted_in_the_interval_left_at_the_acknowledged_step() -> None:
    position, _ = start_run(World(interrupt_at=("sleep", 1)))
    assert shift.interrupted_line(MODEL, "chat@r2", position, None) == (
        f"interrupted: traffic for {MODEL} left at step 1/3 (chat@r2 40%, chat@r1 60%), acknowledged by every live gateway")


def test_interrupted_while_gateways_apply_a_step_left_at_that_step() -> None:
    position, _ = start_run(World(interrupt_at=("ack", 12)))
    assert shift.interrupted_line(MODEL, "chat@r2", position, None) == (
        f"interrupted: traffic for {MODEL} left at step 2/3 (chat@r2 80%, chat@r1 20%): stored, not yet acknowledged "
        "by every live gateway")


def test_interrupted_while_storing_reads_back_what_was_stored() -> None:
    world = World(interrupt_at=("store", 2))
    position, _ = start_run(world)
    assert position.phase == shift.STORING and position.current == 2
    line = shift.interrupted_line(MODEL, "chat@r2", position, world.stored)  # the PUT never arrived
    assert line == f"interrupted: traffic for {MODEL} left at step 1/3 (chat@r2 40%, chat@r1 60%)"
    arrived = shift.interrupted_line(MODEL, "chat@r2", position, position.step(2).weights)
    assert arrived == (f"interrupted: traffic for {MODEL} left at step 2/3 (chat@r2 80%, chat@r1 20%): stored as the "
                       "interrupt came, not waited for")
    unknown = shift.interrupted_line(MODEL, "chat@r2", position, None)
    assert "at step 1/3 or at step 2" in unknown and f"fleetctl traffic get {MODEL}" in unknown
    other = shift.interrupted_line(MODEL, "chat@r2", position, {"chat@r1": 1.0})
    assert other == f"interrupted: traffic for {MODEL} is at chat@r2 0%, chat@r1 100% (changed by someone else meanwhile)"


def test_interrupted_storing_the_first_step_compares_with_the_start() -> None:
    world = World(interrupt_at=("store", 1))
    position, _ = start_run(world, start={"chat@r1": 1.0, "chat@r2": 0.0})
    assert shift.interrupted_line(MODEL, "chat@r2", position, {"chat@r1": 1.0}) == (
        f"interrupted: traffic for {MODEL} unchanged (chat@r2 0%, chat@r1 100%)")
    assert "is as before the shift or at step 1" in shift.interrupted_line(MODEL, "chat@r2", position, None)


# --- the command, against a real controller and gateway loops ---

@pytest.fixture
def served(fleet: Fleet) -> Iterator[Fleet]:
    with ExitStack() as stack:
        serving(fleet, stack, r2=PERFORMANCE_ONLY)
        with fleet.client() as client:
            client.set_traffic(MODEL, {"chat@r1": 1.0})
        yield fleet


def stored(fleet: Fleet) -> dict[str, float]:
    with fleet.client() as client:
        return client.get_traffic(MODEL).weights


def test_shift_runs_every_step_through_every_gateway(served: Fleet) -> None:
    with gateway(served, "gw-a"), gateway(served, "gw-b"):
        wait_listed(served, {"gw-a", "gw-b"})
        result = ok(served.run("traffic", "shift", MODEL, "--to", "chat@r2", "--step", "50", "--interval", "0",
                               "--reason", "bigger batches", "-o", "json", role="operator"))
        with served.client() as client:
            reported = {g.name: g.generation for g in client.list_gateways()}
            audit = [e for e in client.list_audit() if e.action == "traffic.set"]
    summary = json.loads(result.stdout)
    assert (summary["result"], summary["planned"], summary["acknowledged"]) == ("completed", 2, 2)
    assert [s["weights"] for s in summary["steps"]] == [{"chat@r1": 50.0, "chat@r2": 50.0}, {"chat@r1": 0.0, "chat@r2": 100.0}]
    for step in summary["steps"]:  # each step was applied by both gateways before the command went on
        assert step["applied"]["gateways"] == ["gw-a", "gw-b"]
    first, second = (s["generation"] for s in summary["steps"])
    assert first < second <= min(reported.values())
    assert stored(served) == {"chat@r1": 0.0, "chat@r2": 100.0}
    lines = [line for line in result.stderr.splitlines() if not line.startswith("waiting for generation")]
    assert lines[0] == f"shifting {MODEL} to chat@r2 in 2 step(s) of 50 points, 0s apart, from chat@r2 0%, chat@r1 100%"
    assert lines[1].startswith(f"step 1/2: chat@r2 50%, chat@r1 50% (generation {first} applied by 2 gateway(s) in ")
    assert lines[2].startswith(f"step 2/2: chat@r2 100% (generation {second} applied by 2 gateway(s) in ")
    assert lines[-1] == f"traffic {MODEL}: all on chat@r2 after 2 step(s)"
    assert [e.reason for e in audit[-2:]] == ["bigger batches; traffic shift to chat@r2: step 1/2",
                                              "bigger batches; traffic shift to chat@r2: step 2/2"]


def test_a_step_not_acknowledged_stops_the_shift_there(served: Fleet) -> None:
    with gateway(served, "gw-a"), gateway(served, "gw-stuck", stuck_at=0):
        wait_listed(served, {"gw-a", "gw-stuck"})
        result = served.run("traffic", "shift", MODEL, "--to", "chat@r2", "--step", "25", "--interval", "0",
                            "--timeout", "1", role="operator")
    assert result.exit_code == ExitCode.ERROR
    line = one_error_line(result, after_progress=True)
    assert line.startswith("error: step 1/4: generation ") and "not applied within 1s by: gw-stuck (at 0)" in line
    assert line.endswith("the shift stopped at step 1/4")
    assert stored(served) == {"chat@r1": 75.0, "chat@r2": 25.0}  # step 2 was never stored


def test_already_there_changes_nothing(served: Fleet) -> None:
    result = ok(served.run("traffic", "shift", MODEL, "--to", "chat@r1", "-o", "json", role="operator"))
    assert json.loads(result.stdout)["result"] == "unchanged" and "nothing to shift" in result.stderr
    assert stored(served) == {"chat@r1": 1.0}


def test_the_correctness_guard_applies_as_for_traffic_set(fleet: Fleet) -> None:
    with ExitStack() as stack:
        serving(fleet, stack)  # chat@r2 has an 8k context: a correctness difference
        refused = fleet.run("traffic", "shift", MODEL, "--to", "chat@r2", "--interval", "0", role="operator")
        assert refused.exit_code == ExitCode.REFUSED
        assert one_error_line(refused, after_progress=True) == (
            "error: chat@r1 and chat@r2 differ in correctness fields: max_model_len 2048 -> 8192; "
            "pass allow_correctness_change to split traffic anyway")
        assert stored(fleet) == {"chat@r1": 1.0, "chat@r2": 1.0}  # no policy: the deployments' equal shares
        allowed = ok(fleet.run("traffic", "shift", MODEL, "--to", "chat@r2", "--step", "50", "--interval", "0",
                               "--allow-correctness-change", "--yes", "-o", "json", role="operator"))
        assert json.loads(allowed.stdout)["result"] == "completed"
        assert stored(fleet) == {"chat@r1": 0.0, "chat@r2": 100.0}


BAD_OPTIONS = [
    (["--step", "0"], "--step: must be between 0.1 and 100 percentage points, not 0"),
    (["--step", "101"], "--step: must be between 0.1 and 100 percentage points, not 101"),
    (["--interval", "-1s"], "--interval: '-1s' is not a duration"),
    (["--interval", "soon"], "--interval: 'soon' is not a duration"),
]


@pytest.mark.parametrize(("args", "says"), BAD_OPTIONS)
def test_bad_options_are_usage_errors_on_one_line(args: list[str], says: str) -> None:
    controller = f"http://127.0.0.1:{free_port()}"  # never reached: options are checked first
    result = CliRunner().invoke(app, ["--controller", controller, "--token", "t", "traffic", "shift", MODEL,
                                      "--to", "chat@r2", *args])
    assert result.exit_code == ExitCode.USAGE
    assert says in one_error_line(result)


def test_a_target_that_is_not_a_revision_is_a_usage_error() -> None:
    controller = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["--controller", controller, "--token", "t", "traffic", "shift", MODEL, "--to", "chat"])
    assert result.exit_code == ExitCode.USAGE
    assert "--to: class reference 'chat' is not of the form NAME@rN" in one_error_line(result)


def test_an_unknown_revision_or_another_models_is_refused(served: Fleet) -> None:
    unknown = served.run("traffic", "shift", MODEL, "--to", "chat@r9", role="operator")
    assert unknown.exit_code == ExitCode.NOT_FOUND and "chat@r9" in one_error_line(unknown)
    other = served.run("traffic", "shift", "other-model", "--to", "chat@r2", role="operator")
    assert other.exit_code == ExitCode.USAGE
    assert one_error_line(other) == f"error: --to: chat@r2 serves '{MODEL}', not 'other-model'"
    assert stored(served) == {"chat@r1": 1.0}
