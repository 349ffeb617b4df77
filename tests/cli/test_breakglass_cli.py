"""`fleetctl breakglass` against a real controller on loopback with real routing-table gateways: a pin
waits until every live gateway has it and shows in `fleetctl status` and `breakglass status`; freeze and
unfreeze; refusals (no reason, not an admin, a revision that does not serve the model) are one error line,
a non-zero exit and nothing stored."""

from __future__ import annotations

import json
from contextlib import ExitStack

from cli_helpers import Fleet, ok, one_error_line
from traffic_helpers import MODEL, gateway, serving, wait_listed

from fleetctl.cli.exit_codes import ExitCode


def routing_flags(fleet: Fleet) -> dict[str, object]:
    with fleet.client("viewer") as api:
        return dict(api.routing().flags)


def test_pin_waits_for_the_gateways_and_shows_in_status_until_unpinned(fleet: Fleet) -> None:
    with ExitStack() as stack:
        serving(fleet, stack)
        stack.enter_context(gateway(fleet, "gw-a"))
        wait_listed(fleet, {"gw-a"})
        result = ok(fleet.run("breakglass", "pin", MODEL, "chat@r1", "--reason", "r2 answers drift", "--yes",
                              "-o", "json"))
        shown = json.loads(result.stdout)
        assert (shown["name"], shown["value"], shown["result"]) == (f"pin:{MODEL}", "chat@r1", "changed")
        assert shown["applied"]["gateways"] == ["gw-a"]
        assert f"{MODEL} pinned to chat@r1" in result.stderr
        status = ok(fleet.run("status", role="viewer")).stdout
        assert f"PINNED: all of {MODEL}'s traffic goes to chat@r1" in status and "r2 answers drift" in status
        holds = json.loads(ok(fleet.run("breakglass", "status", "-o", "json", role="viewer")).stdout)
        assert [(h["hold"], h["value"]) for h in holds] == [(f"pin:{MODEL}", "chat@r1")]
        ok(fleet.run("breakglass", "unpin", MODEL, "--reason", "fixed"))
        assert routing_flags(fleet) == {}
        assert "PINNED" not in ok(fleet.run("status", role="viewer")).stdout


def test_freeze_shows_in_status_and_unfreeze_lifts_it(fleet: Fleet) -> None:
    result = ok(fleet.run("breakglass", "freeze", "--reason", "bad config pushed", "--ttl", "1h"))
    assert "fleet frozen (changed)" in result.stderr and "until" in result.stderr
    status = ok(fleet.run("status", role="viewer")).stdout
    assert "FROZEN: the reconciler and rollouts change nothing" in status and "bad config pushed" in status
    ok(fleet.run("breakglass", "unfreeze", "--reason", "config rolled back"))
    assert "FROZEN" not in ok(fleet.run("status", role="viewer")).stdout
    actions = [e.action for e in fleet.client("viewer").list_audit()]
    assert actions[-2:] == ["breakglass.freeze", "breakglass.unfreeze"]


def test_refusals_are_one_line_and_store_nothing(fleet: Fleet) -> None:
    no_reason = fleet.run("breakglass", "freeze")
    assert no_reason.exit_code == ExitCode.USAGE and "--reason is required" in one_error_line(no_reason)
    operator = fleet.run("breakglass", "kill-switch", "prefix_routing", "--reason", "x", "--yes", role="operator")
    assert operator.exit_code != 0 and "needs role admin" in one_error_line(operator)
    not_a_switch = fleet.run("breakglass", "kill-switch", "freeze", "--reason", "x", "--yes")
    assert not_a_switch.exit_code == ExitCode.USAGE and "not a kill switch" in one_error_line(not_a_switch)
    unserved = fleet.run("breakglass", "pin", MODEL, "chat@r9", "--reason", "x", "--yes")
    assert unserved.exit_code == ExitCode.USAGE and "no deployment or traffic policy" in one_error_line(unserved)
    assert routing_flags(fleet) == {}
