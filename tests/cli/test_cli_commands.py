"""fleetctl commands end to end against a real controller: classes, deployments, nodes, engines,
status, audit, tokens."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from cli_helpers import Fleet, class_file, ok, one_error_line

from fleetctl.cli.exit_codes import ExitCode


def register(fleet: Fleet, node: str) -> None:
    with fleet.client() as client:
        client.register_agent({"node": node, "url": f"http://{node}", "labels": {"zone": "a"},
                               "capacity": {"engines": 2, "kv_mib": 1}, "agent_version": "t"})


def test_class_apply_is_idempotent_and_history_marks_correctness(fleet: Fleet, tmp_path: Path) -> None:
    first = ok(fleet.run("class", "apply", "-f", class_file(tmp_path), "--reason", "first"))
    assert first.stdout.split()[3:5] == ["chat@r1", "created"]
    again = ok(fleet.run("class", "apply", "-f", class_file(tmp_path), "-o", "json"))
    assert json.loads(again.stdout)["result"] == "unchanged" and "unchanged" in again.stderr
    ok(fleet.run("class", "apply", "-f", class_file(tmp_path, dtype="bfloat16", seqs=128)))
    got = yaml.safe_load(ok(fleet.run("class", "get", "chat")).stdout)
    assert got["ref"] == "chat@r2" and got["spec"]["dtype"] == "bfloat16"
    assert json.loads(ok(fleet.run("class", "get", "chat@r1", "-o", "json")).stdout)["spec"]["dtype"] == "float32"
    listed = ok(fleet.run("class", "list")).stdout
    assert "chat@r2" in listed
    history = ok(fleet.run("class", "history", "chat")).stdout
    assert "chat@r1 -> chat@r2" in history
    assert "! dtype: 'float32' -> 'bfloat16'  (correctness)" in history
    assert "  max_num_seqs: 64 -> 128  (performance)" in history
    changes = json.loads(ok(fleet.run("class", "history", "chat", "-o", "json")).stdout)[1]["changes"]
    assert changes[0] == {"field": "dtype", "tag": "correctness", "old": "float32", "new": "bfloat16"}


def test_deploy_set_list_delete(fleet: Fleet, tmp_path: Path) -> None:
    ok(fleet.run("class", "apply", "-f", class_file(tmp_path)))
    created = ok(fleet.run("deploy", "set", "chat", "--class", "chat", "--replicas", "2", "--label", "zone=a", "-o", "yaml"))
    assert yaml.safe_load(created.stdout)["class_ref"] == "chat@r1"
    assert "created" in created.stderr
    assert "unchanged" in ok(fleet.run("deploy", "set", "chat", "--class", "chat@r1", "--replicas", "2", "--label", "zone=a")).stderr
    listed = json.loads(ok(fleet.run("deploy", "list", "-o", "json")).stdout)
    assert [(d["name"], d["replicas"], d["placement"]) for d in listed] == [("chat", 2, {"zone": "a"})]
    aborted = fleet.run("deploy", "delete", "chat", input="n\n")
    assert aborted.exit_code == ExitCode.ERROR
    ok(fleet.run("deploy", "delete", "chat", "--yes"))
    assert json.loads(ok(fleet.run("deploy", "list", "-o", "json")).stdout) == []


def test_node_cordon_uncordon_and_show(fleet: Fleet) -> None:
    register(fleet, "n1")
    ok(fleet.run("node", "cordon", "n1", input="y\n"))
    shown = yaml.safe_load(ok(fleet.run("node", "show", "n1")).stdout)
    assert shown["cordoned"] is True
    ok(fleet.run("node", "uncordon", "n1", "--reason", "done"))
    nodes = json.loads(ok(fleet.run("node", "list", "-o", "json")).stdout)
    assert [(n["name"], n["cordoned"]) for n in nodes] == [("n1", False)]
    assert "n1" in ok(fleet.run("node", "list")).stdout


def test_status_and_engines(fleet: Fleet, tmp_path: Path) -> None:
    register(fleet, "n1")
    ok(fleet.run("class", "apply", "-f", class_file(tmp_path)))
    ok(fleet.run("deploy", "set", "chat", "--class", "chat@r1", "--replicas", "1"))
    fleet.server.runtime.step()
    status = json.loads(ok(fleet.run("status", "-o", "json", role="viewer")).stdout)
    assert set(status) == {"controller", "nodes", "engines", "deployments", "drifted", "gateways", "break_glass"}
    assert [e["name"] for e in status["engines"]] == ["chat-0"]
    table = ok(fleet.run("status", role="viewer")).stdout
    assert "NODE" in table and "chat-0" in table and "DEPLOYMENT" in table
    assert "chat-0" in ok(fleet.run("engine", "list", "--node", "n1")).stdout
    assert yaml.safe_load(ok(fleet.run("engine", "show", "chat-0")).stdout)["state"] == "pending"


def test_audit_list_filters(fleet: Fleet, tmp_path: Path) -> None:
    ok(fleet.run("class", "apply", "-f", class_file(tmp_path), "--reason", "because", role="operator"))
    fleet.run("deploy", "set", "chat", "--class", "ghost@r1", "--replicas", "1", role="operator")
    events = json.loads(ok(fleet.run("audit", "list", "--since", "1h", "-o", "json", role="viewer")).stdout)
    assert [(e["action"], e["result"]) for e in events] == [("class.apply", "ok"), ("deployment.set", "refused")]
    assert events[0]["reason"] == "because"
    actor = events[0]["actor"]
    assert len(json.loads(ok(fleet.run("audit", "list", "--actor", actor, "-o", "json")).stdout)) == 2
    assert json.loads(ok(fleet.run("audit", "list", "--actor", "nobody", "-o", "json")).stdout) == []
    assert "class.apply" in ok(fleet.run("audit", "list")).stdout


def test_token_create_list_revoke(fleet: Fleet) -> None:
    created = ok(fleet.run("token", "create", "ci", "--role", "viewer"))
    token = created.stdout.strip()
    assert token.startswith("fleet_") and "not shown again" in created.stderr
    ok(fleet.run("--token", token, "status", role=None))
    assert "ci" in ok(fleet.run("token", "list")).stdout
    ok(fleet.run("token", "revoke", "ci", "--yes"))
    refused = fleet.run("--token", token, "status", role=None)
    assert refused.exit_code == ExitCode.AUTH


def test_token_revoke_refuses_the_token_in_use_without_force(fleet: Fleet) -> None:
    me = next(t.name for t in fleet.client().list_tokens() if t.name.startswith("test-admin"))
    refused = fleet.run("token", "revoke", me, "--yes")
    assert refused.exit_code == ExitCode.REFUSED
    assert "locks you out" in one_error_line(refused) and "--force" in one_error_line(refused)
    forced = ok(fleet.run("token", "revoke", me, "--yes", "--force"))
    assert "forced past own_token" in forced.stderr


def test_the_class_commands_correctness_tag_is_the_replica_class_one() -> None:
    """class_cmd spells the tag itself (importing replica_class would cost every CLI start its models)."""
    from fleetctl.cli import class_cmd
    from fleetctl.replica_class import CORRECTNESS

    assert class_cmd.CORRECTNESS == CORRECTNESS
