"""The same options mean the same thing on every command, so a script written against one works on the rest.

Every command of the `fleetctl` tree is named below in exactly one of three lists:
- READ: it shows data and takes `-o/--output table|json|yaml`;
- DESTRUCTIVE: it can stop, remove or move what serves (or revoke access) and takes `--yes/-y`; where it asks
  nothing, `--yes` is accepted and changes nothing;
- OTHER: it only adds or restores (`class apply`, `node uncordon`, `up`) or runs a process in the foreground.
A new command fails the first test until it is put in one of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from cli_helpers import Fleet, class_file, ok
from typer.testing import CliRunner

from fleetctl.cli.main import app

READ = {
    "status", "node list", "node show", "engine list", "engine show", "class get", "class list", "class history",
    "deploy list", "audit list", "token list", "traffic get", "route explain", "agent engines", "class diff",
    "rollout list", "rollout status", "rollout history", "drill list",
    "canary status", "canary show", "canary events",
    "canary references", "canary golden check", "gateway list", "flag list", "flag get",
    "breakglass status", "breakglass divergence",
    "runbook list", "runbook show", "runbook validate",
    "pd status", "pd plan", "pd show", "pd list",
    "kv status",
}
DESTRUCTIVE = {
    "node cordon", "node drain", "engine drain", "engine cordon", "deploy set", "deploy delete", "token revoke",
    "traffic set",
    "traffic shift", "down", "agent drain", "agent restart", "agent stop",
    "rollout start", "rollout promote", "rollout abort", "rollout retry", "rollout undo",  # they move traffic
    "drill misroute", "drill plant",  # they change what production users get
    "breakglass pin", "breakglass shed", "breakglass kill-switch",  # so do these, on purpose, in an incident
    "engine stop", "engine restart",  # direct mode: the agent stops or restarts a serving engine
    "breakglass reconcile",  # a revert restarts engines and drops pins
    "runbook run",  # its steps drain, pin and shed (it confirms each step unless --yes)
    "pd rebalance",  # it drains engines and restarts them in another role
    "engine release",  # the gateways stop routing to an adopted engine
    "kv flush",  # drops the node's cached KV blocks: prompts are computed again
}
OTHER = {
    "node uncordon", "engine uncordon", "class apply", "token create", "up", "controller migrate",
    "controller serve", "agent serve", "engine serve", "gateway serve",
    "rollout pause", "rollout resume", "rollout watch",
    "drill stop",  # restores traffic and engines as they were before the drill
    "canary record",  # stores a golden set and a reference; serves nothing
    "canary probes",  # turns the canary's probes on or off
    "flag set", "flag unset",  # kill switches: a reason is required and audited, and a TTL bounds them
    "breakglass freeze", "breakglass unfreeze", "breakglass unpin",  # they hold or lift; serving goes on
    "tui",  # the live view in the foreground (its actions confirm in the TUI)
    "pd stop",  # the flip in progress finishes; nothing more moves
    "pd profile",  # measures one engine with a short burst of requests and stores the figures
    "pd mode",  # the planner's settings (in auto mode it rebalances as `pd rebalance` would, within its limits)
    "engine adopt",  # checks an engine fleetctl did not launch against its class and adds it: serving goes on
}
OUTPUT_FORMATS = {"table", "json", "yaml"}


def walk(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(`noun verb`, command) for every runnable command; a group without subcommands (status) is one."""
    subcommands = getattr(command, "commands", None)
    if subcommands:
        for name, sub in subcommands.items():
            yield from walk(sub, (*path, name))
    else:
        yield " ".join(path), command


COMMANDS = dict(walk(typer.main.get_command(app)))


def option(command: Any, flag: str) -> Any:
    return next((p for p in command.params if flag in p.opts or flag in p.secondary_opts), None)


def test_every_command_is_classified_once() -> None:
    assert not READ & DESTRUCTIVE and not READ & OTHER and not DESTRUCTIVE & OTHER
    assert set(COMMANDS) == READ | DESTRUCTIVE | OTHER


@pytest.mark.parametrize("name", sorted(READ))
def test_every_read_takes_output_table_json_yaml(name: str) -> None:
    short, long = option(COMMANDS[name], "-o"), option(COMMANDS[name], "--output")
    assert short is not None and short is long, f"{name} has no -o/--output"
    assert {choice.value for choice in short.type_descriptor.annotation} == OUTPUT_FORMATS


@pytest.mark.parametrize("name", sorted(DESTRUCTIVE))
def test_every_destructive_command_takes_yes(name: str) -> None:
    short, long = option(COMMANDS[name], "-y"), option(COMMANDS[name], "--yes")
    assert short is not None and short is long, f"{name} has no --yes/-y"
    assert short.is_flag and short.default is False


def test_down_accepts_yes_where_there_is_nothing_to_stop(tmp_path) -> None:
    for flag in ("--yes", "-y"):
        result = CliRunner().invoke(app, ["down", flag, "--state-dir", str(tmp_path)])
        assert result.exit_code == 0, result.output
        assert "nothing to stop" in result.stderr


LIST_READS = [["status"], ["node", "list"], ["engine", "list"], ["class", "list"], ["deploy", "list"],
              ["audit", "list"], ["token", "list"], ["rollout", "list"]]


@pytest.mark.parametrize("args", LIST_READS, ids=" ".join)
def test_reads_print_json_for_scripts(fleet: Fleet, args: list[str]) -> None:
    result = ok(fleet.run(*args, "-o", "json"))
    json.loads(result.stdout)  # the whole of stdout is one JSON document


def test_deploy_set_takes_yes_and_prints_json(fleet: Fleet, tmp_path) -> None:
    ok(fleet.run("class", "apply", "-f", class_file(tmp_path)))
    result = ok(fleet.run("deploy", "set", "web", "--class", "chat", "--replicas", "0", "--yes", "-o", "json"))
    assert json.loads(result.stdout)["name"] == "web"
    ok(fleet.run("deploy", "delete", "web", "-y"))
    assert json.loads(ok(fleet.run("deploy", "list", "-o", "json")).stdout) == []
