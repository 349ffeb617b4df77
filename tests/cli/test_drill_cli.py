"""`fleetctl drill misroute|plant|stop|list` end to end against a real controller on loopback (SQLite, and
PostgreSQL when FLEET_TEST_PG_URL is set), with the minimal agent loop of traffic_helpers keeping two
revisions' engines ready. Bad input is one line and a non-zero exit; starts ask first unless --yes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from cli_helpers import Fleet, ok, one_error_line
from traffic_helpers import MODEL, serving
from typer.testing import CliRunner

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.main import app
from fleetctl.controller.server import free_port


@pytest.fixture
def served(fleet: Fleet) -> Iterator[Fleet]:
    with ExitStack() as stack:
        serving(fleet, stack)
        yield fleet


BAD_ARGS = [
    (["misroute", "--model", MODEL, "--to", "chat@r2", "--fraction", "0.1", "--duration", "5x"], "--duration: '5x' is not a duration"),
    (["misroute", "--model", MODEL, "--to", "chat@r2", "--fraction", "0.1", "--duration", "0s"], "--duration: '0s' must be more than 0"),
    (["misroute", "--model", MODEL, "--to", "chat", "--fraction", "0.1"], "--to: class reference 'chat' is not of the form NAME@rN"),
    (["plant", "--engine", "chat-r1-0", "--fault", "bogus"], "--fault: 'bogus' is not a planted fault; one of approx_topk"),
    (["stop"], "give a drill ID or --all"),
    (["stop", "3", "--all"], "give a drill ID or --all"),
]


@pytest.mark.parametrize(("args", "says"), BAD_ARGS, ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_bad_input_is_a_usage_error_on_one_line(args: list[str], says: str) -> None:
    controller = f"http://127.0.0.1:{free_port()}"  # never reached: the input is checked first
    result = CliRunner().invoke(app, ["--controller", controller, "--token", "t", "drill", *args])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert says in one_error_line(result)


def drills(fleet: Fleet) -> list[dict]:
    return json.loads(ok(fleet.run("drill", "list", "-o", "json", role="viewer")).stdout)


def test_a_misroute_asks_first_then_runs_shows_and_stops(served: Fleet) -> None:
    start = ["drill", "misroute", "--model", MODEL, "--to", "chat@r2", "--fraction", "0.15", "--duration", "20m"]
    declined = served.run(*start, role="operator", input="n\n")
    assert declined.exit_code == 1 and "Send 15% of smollm2-135m's production traffic to chat@r2 for 20m?" in declined.output
    assert drills(served) == []

    started = ok(served.run(*start, "--yes", "--reason", "canary drill", role="operator", ))
    assert "misroute 15% of smollm2-135m's traffic to chat@r2 for 20m started" in started.stderr
    (drill,) = drills(served)
    assert (drill["kind"], drill["to_ref"], drill["fraction"], drill["active"]) == ("misroute", "chat@r2", 0.15, True)
    listed = ok(served.run("drill", "list", role="viewer")).stdout.splitlines()
    assert listed[0].split() == ["ID", "KIND", "MODEL", "TARGET", "WHAT", "STATE", "ENDS", "LEFT", "BY"]
    assert listed[1].split()[:6] == [str(drill["id"]), "misroute", MODEL, "chat@r2", "15%", "active"]
    shown = ok(served.run("traffic", "get", MODEL, role="viewer"))
    assert f"drill {drill['id']}: misroute 15%" in shown.stderr and "in effect until" in shown.stderr

    twice = served.run(*start, "--yes", role="operator")
    assert twice.exit_code == ExitCode.REFUSED and "already has drill" in one_error_line(twice)
    stopped = ok(served.run("drill", "stop", str(drill["id"]), role="operator"))
    assert f"stopped drill {drill['id']}: misroute" in stopped.stderr
    assert [d["active"] for d in drills(served)] == [False]
    again = ok(served.run("drill", "stop", str(drill["id"]), role="operator"))
    assert "had ended already" in again.stderr
    audit = json.loads(ok(served.run("audit", "list", "-o", "json", role="viewer")).stdout)
    assert [e["action"] for e in audit if e["action"].startswith("drill.")] == ["drill.start", "drill.start",
                                                                               "drill.stop", "drill.stop"]
    assert audit[-1]["result"] == "noop"


def test_refusals_of_the_controller_are_one_line_naming_the_field(served: Fleet) -> None:
    base = ["drill", "misroute", "--model", MODEL, "--to", "chat@r2", "--yes"]
    too_much = served.run(*base, "--fraction", "0.9", role="operator")
    assert too_much.exit_code == ExitCode.USAGE and "fraction: must be more than 0 and at most 0.5" in one_error_line(too_much)
    too_long = served.run(*base, "--fraction", "0.1", "--duration", "5h", role="operator")
    assert too_long.exit_code == ExitCode.USAGE and "duration_s: must be more than 0 s and at most" in one_error_line(too_long)
    unknown = served.run("drill", "misroute", "--model", MODEL, "--to", "chat@r7", "--fraction", "0.1", "--yes", role="operator")
    assert unknown.exit_code == ExitCode.NOT_FOUND and "no class revision 'chat@r7'" in one_error_line(unknown)
    viewer = served.run(*base, "--fraction", "0.1", role="viewer")
    assert viewer.exit_code == ExitCode.AUTH
    missing = served.run("drill", "stop", "99", role="operator")
    assert missing.exit_code == ExitCode.NOT_FOUND and "no drill 99" in one_error_line(missing)
    assert drills(served) == []


def test_a_plant_runs_until_stop_all(served: Fleet) -> None:
    engine = next(e.name for e in served.client().list_engines() if e.class_ref == "chat@r1")
    started = ok(served.run("drill", "plant", "--engine", engine, "--fault", "kv_bf16", "--duration", "90s", "--yes",
                            "-o", "json", role="operator"))
    view = json.loads(started.stdout)
    assert (view["kind"], view["engine"], view["fault"], view["remaining_s"]) == ("plant", engine, "kv_bf16", 90.0)
    assert f"plant kv_bf16 in engine {engine} ({MODEL}) for 1.5m started" in started.stderr
    stopped = json.loads(ok(served.run("drill", "stop", "--all", "-o", "json", role="operator")).stdout)
    assert [d["id"] for d in stopped] == [view["id"]]
    nothing = ok(served.run("drill", "stop", "--all", role="operator"))
    assert "no drill was in effect" in nothing.stderr
