"""`fleetctl flag list|get|set|unset` against a real controller on loopback: a TTL'd override shows with its
owner, reason and expiry and reaches the routing table; unset restores the default; JSON for scripts; bad
input (an unknown flag, a wrong value, no reason, a bad TTL) is one error line, a non-zero exit and nothing
stored."""

from __future__ import annotations

import json

import pytest
from cli_helpers import Fleet, ok, one_error_line

from fleetctl.cli.exit_codes import ExitCode


def routing_flags(fleet: Fleet) -> dict[str, object]:
    with fleet.client("viewer") as api:
        return dict(api.routing().flags)


def test_set_list_get_and_unset(fleet: Fleet) -> None:
    result = ok(fleet.run("flag", "set", "shed_fraction", "0.2", "--model", "chat", "--ttl", "30m",
                          "--reason", "overload", "-o", "json", role="operator"))
    shown = json.loads(result.stdout)
    assert (shown["name"], shown["value"], shown["result"]) == ("shed_fraction:chat", 0.2, "changed")
    assert shown["expires_at"] and shown["applied"]["gateways"] == []  # no gateway registered: nothing to wait for
    assert "flag shed_fraction:chat: changed (0.2, until" in result.stderr
    assert routing_flags(fleet) == {"shed_fraction:chat": 0.2}

    table = ok(fleet.run("flag", "list", role="viewer")).stdout.splitlines()
    assert table[0].split()[:4] == ["FLAG", "VALUE", "DEFAULT", "OVERRIDE"]
    (row,) = [line for line in table if line.startswith("shed_fraction:chat")]
    assert " 0.2 " in row and "overload" in row and "until" in row
    assert any(line.startswith("prefix_routing") and " true " in line for line in table)  # every flag, at its default

    got = json.loads(ok(fleet.run("flag", "get", "shed_fraction:chat", "-o", "json", role="viewer")).stdout)
    assert (got["value"], got["default"], got["reason"], got["overridden"]) == (0.2, 0.0, "overload", True)

    unset = ok(fleet.run("flag", "unset", "shed_fraction", "-m", "chat", "--reason", "load is back", role="operator"))
    assert "back to its default (0)" in unset.stderr
    assert routing_flags(fleet) == {}


def test_a_controller_flag_says_when_it_applies(fleet: Fleet) -> None:
    result = ok(fleet.run("flag", "set", "reconciler", "off", "--reason", "incident 42", role="operator"))
    assert "next reconcile pass" in result.stderr
    with fleet.client("viewer") as api:
        assert api.get_flag("reconciler").value is False


@pytest.mark.parametrize(("args", "says"), [
    (("set", "no_such_flag", "true"), "unknown flag 'no_such_flag'"),
    (("set", "shed_fraction", "0.5"), "shed_fraction is set per model"),
    (("set", "prefix_routing", "maybe"), "prefix_routing is a boolean"),
    (("set", "shed_fraction", "1.5", "--model", "chat"), "number in [0, 1]"),
    (("set", "prefix_routing", "false", "--ttl", "soon"), "--ttl: not a duration"),
    (("get", "no_such_flag"), "unknown flag"),
])
def test_bad_input_is_one_line_and_stores_nothing(fleet: Fleet, args: tuple[str, ...], says: str) -> None:
    reason = ("--reason", "test") if args[0] == "set" else ()
    result = fleet.run("flag", *args, *reason, role="operator")
    assert result.exit_code == ExitCode.USAGE, (result.exit_code, result.output)
    assert says in one_error_line(result)
    assert routing_flags(fleet) == {}


def test_set_needs_a_reason(fleet: Fleet) -> None:
    result = fleet.run("flag", "set", "prefix_routing", "false", role="operator")
    assert result.exit_code == ExitCode.USAGE and "--reason is required" in one_error_line(result)
    assert routing_flags(fleet) == {}
