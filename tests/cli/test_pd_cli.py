"""`fleetctl pd status|plan|rebalance|stop|show|list|mode` end to end against a real controller on loopback
(SQLite, and PostgreSQL when FLEET_TEST_PG_URL is set), with the minimal agent loop of traffic_helpers and
a gateway loop. Bad input is one line and a non-zero exit, and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from cli_helpers import Fleet, ok, one_error_line
from traffic_helpers import MODEL, SPEC, agent, gateway

from fleetctl.cli.exit_codes import ExitCode


@pytest.fixture
def pd_fleet(fleet: Fleet) -> Iterator[Fleet]:
    """chat@r1 as 1 prefill + 3 decode engines, kept ready by an agent loop, routed by one gateway."""
    with ExitStack() as stack, fleet.client("operator") as client:
        client.apply_class("chat", SPEC)
        client.set_deployment("chat-prefill", "chat@r1", 1, role="prefill")
        client.set_deployment("chat-decode", "chat@r1", 3, role="decode")
        stack.enter_context(agent(fleet))
        stack.enter_context(gateway(fleet, "gw-1"))
        yield fleet


def status_json(fleet: Fleet) -> list[dict]:
    return json.loads(ok(fleet.run("pd", "status", "-o", "json", role="viewer")).stdout)


def deployments(fleet: Fleet) -> dict[str, int]:
    with fleet.client("viewer") as client:
        return {d.name: d.replicas for d in client.list_deployments()}


def wait_ratio(fleet: Fleet, ratio: dict[str, int]) -> None:
    import time
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if status_json(fleet)[0]["ratio"] == ratio and len(status_json(fleet)[0]["engines"]) == sum(ratio.values()):
            return
        time.sleep(0.1)
    raise AssertionError(status_json(fleet))


def test_status_and_plan_show_the_ratio_and_the_reasoning(pd_fleet: Fleet) -> None:
    wait_ratio(pd_fleet, {"prefill": 1, "decode": 3, "mixed": 0})
    table = ok(pd_fleet.run("pd", "status", role="viewer")).stdout
    assert "1P:3D" in table and MODEL in table and "off" in table
    plan = ok(pd_fleet.run("pd", "plan", MODEL, role="viewer")).stdout
    assert plan.startswith(f"{MODEL} (chat@r1, mode off, profile default): 1P:3D")
    assert "recommendation:" in plan or "no recommendation yet" in plan
    planned = json.loads(ok(pd_fleet.run("pd", "plan", MODEL, "-o", "json", role="viewer")).stdout)
    assert planned[0]["profile"]["source"] == "default"


def test_rebalance_without_apply_prints_the_plan_and_changes_nothing(pd_fleet: Fleet) -> None:
    wait_ratio(pd_fleet, {"prefill": 1, "decode": 3, "mixed": 0})
    out = ok(pd_fleet.run("pd", "rebalance", MODEL, "--prefill", "2", "--decode", "2", role="operator")).stdout
    assert "1P:3D -> 2P:2D, 1 flip(s)" in out and "decode" in out and "add --apply" in out
    as_json = json.loads(ok(pd_fleet.run("pd", "rebalance", MODEL, "--prefill", "2", "--decode", "2", "-o", "json",
                                         role="operator")).stdout)
    assert as_json["flips"][0]["to_role"] == "prefill"
    assert deployments(pd_fleet) == {"chat-prefill": 1, "chat-decode": 3}
    assert json.loads(ok(pd_fleet.run("pd", "list", "-o", "json", role="viewer")).stdout) == []


@pytest.mark.parametrize(("args", "says", "code"), [
    (["--prefill", "0", "--decode", "4"], "prefill: 0 is below the floor of 1", ExitCode.USAGE),
    (["--prefill", "3", "--decode", "3"], "a rebalance keeps the engine count", ExitCode.USAGE),
    (["--prefill", "2", "--decode", "2", "--floor-decode", "3"], "decode: 2 is below the floor of 3", ExitCode.USAGE),
], ids=["prefill-0", "count", "floor"])
def test_bad_targets_are_one_line_and_change_nothing(pd_fleet: Fleet, args: list[str], says: str, code: int) -> None:
    wait_ratio(pd_fleet, {"prefill": 1, "decode": 3, "mixed": 0})
    result = pd_fleet.run("pd", "rebalance", MODEL, *args, "--apply", "--yes", role="operator")
    assert result.exit_code == code, result.output
    assert says in one_error_line(result)
    assert deployments(pd_fleet) == {"chat-prefill": 1, "chat-decode": 3}


def test_an_unknown_model_is_one_line(fleet: Fleet) -> None:
    result = fleet.run("pd", "rebalance", "nope", "--prefill", "1", "--decode", "1", "--apply", "--yes", role="operator")
    assert result.exit_code == ExitCode.NOT_FOUND and "'nope' has no deployment" in one_error_line(result)
    assert fleet.run("pd", "status", "nope", role="viewer").exit_code == ExitCode.NOT_FOUND


def test_a_frozen_fleet_refuses_a_rebalance(pd_fleet: Fleet) -> None:
    wait_ratio(pd_fleet, {"prefill": 1, "decode": 3, "mixed": 0})
    ok(pd_fleet.run("breakglass", "freeze", "--reason", "incident", role="admin"))
    result = pd_fleet.run("pd", "rebalance", MODEL, "--prefill", "2", "--decode", "2", "--apply", "--yes", role="operator")
    assert result.exit_code == ExitCode.REFUSED and "frozen" in one_error_line(result)
    assert deployments(pd_fleet) == {"chat-prefill": 1, "chat-decode": 3}


def test_apply_asks_first_then_follows_the_rebalance_to_the_end(pd_fleet: Fleet) -> None:
    wait_ratio(pd_fleet, {"prefill": 1, "decode": 3, "mixed": 0})
    declined = pd_fleet.run("pd", "rebalance", MODEL, "--prefill", "2", "--decode", "2", "--apply", role="operator",
                            input="n\n")
    assert declined.exit_code != 0 and deployments(pd_fleet) == {"chat-prefill": 1, "chat-decode": 3}
    done = ok(pd_fleet.run("pd", "rebalance", MODEL, "--prefill", "2", "--decode", "2", "--apply", "--yes",
                           "--baseline", "0", "--reason", "more prefill", "-o", "json", role="operator"))
    view = json.loads(done.stdout)
    assert view["phase"] == "completed" and len(view["flips"]) == 1
    assert "flip_started" in done.stderr and "completed" in done.stderr
    assert deployments(pd_fleet) == {"chat-prefill": 2, "chat-decode": 2}
    wait_ratio(pd_fleet, {"prefill": 2, "decode": 2, "mixed": 0})
    again = ok(pd_fleet.run("pd", "rebalance", MODEL, "--prefill", "2", "--decode", "2", "--apply", "--yes",
                            role="operator"))
    assert "already at 2P:2D: nothing to do" in again.stderr
    shown = ok(pd_fleet.run("pd", "show", str(view["id"]), role="viewer")).stdout
    assert "flip_done" in shown and "more prefill" in shown
    listed = json.loads(ok(pd_fleet.run("pd", "list", MODEL, "-o", "json", role="viewer")).stdout)
    assert [r["id"] for r in listed] == [view["id"]]


def test_mode_sets_the_planner_and_refuses_a_bad_one(pd_fleet: Fleet) -> None:
    ok(pd_fleet.run("pd", "mode", MODEL, "advisory", "--ttft-slo", "1.5", "--reason", "try it", role="operator"))
    (model,) = status_json(pd_fleet)
    assert model["mode"] == "advisory" and model["settings"]["ttft_slo_s"] == 1.5
    bad = pd_fleet.run("pd", "mode", MODEL, "sometimes", role="operator")
    assert bad.exit_code == ExitCode.USAGE and "mode: one of off, advisory, auto" in one_error_line(bad)
    assert status_json(pd_fleet)[0]["mode"] == "advisory"
    ok(pd_fleet.run("pd", "mode", MODEL, "--cooldown", "60", "--dwell", "5", "--reason", "a faster mix",
                    role="operator"))
    (model,) = status_json(pd_fleet)
    assert (model["settings"]["cooldown_s"], model["settings"]["dwell_s"], model["mode"]) == (60.0, 5.0, "advisory")
    too_long = pd_fleet.run("pd", "mode", MODEL, "--cooldown", "100000", "--reason", "x", role="operator")
    assert too_long.exit_code != 0 and "cooldown_s" in one_error_line(too_long)
    assert status_json(pd_fleet)[0]["settings"]["cooldown_s"] == 60.0
