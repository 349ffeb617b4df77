"""`fleetctl class diff --live MODEL` against a real controller: each running engine against its class
revision, exit 7 when one drifted and 0 when none did; the DRIFT column of `engine list` and the line in
`status`; bad use is one line and the usage exit code."""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import Fleet, class_file, ok, one_error_line

CHAT = "smollm2-135m"  # the model of cli_helpers' class file (chat@r1: dtype float32, KV auto)


def run_engine(fleet: Fleet, tmp_path: Path, kv_dtype: str) -> None:
    """chat@r1 with one engine on n1, reported by its agent as holding KV in `kv_dtype`."""
    ok(fleet.run("class", "apply", "-f", class_file(tmp_path)))
    ok(fleet.run("deploy", "set", "chat", "--class", "chat@r1", "--replicas", "1"))
    with fleet.client() as client:
        client.register_agent({"node": "n1", "url": "http://n1", "labels": {}, "capacity": {"engines": 2, "kv_mib": 1},
                               "agent_version": "t"})
        fleet.server.runtime.step()
        (assigned,) = client.heartbeat({"node": "n1", "generation": 0, "engines": []}).assignment
        engine = {"name": assigned.name, "model": assigned.model, "class_ref": assigned.class_ref, "role": "mixed",
                  "state": "ready", "pid": 10, "port": 8100, "url": "http://n1:8100",
                  "reported": {"source": "reference", "settings": {"kv_cache_dtype": kv_dtype, "dtype": "float32"}}}
        client.heartbeat({"node": "n1", "generation": 1, "engines": [engine]})


def test_a_drifted_engine_is_named_and_the_exit_code_is_7(fleet: Fleet, tmp_path: Path) -> None:
    run_engine(fleet, tmp_path, "bfloat16")
    result = fleet.run("class", "diff", "--live", CHAT, role="viewer")
    assert result.exit_code == 7, result.output
    assert "chat-0" in result.stdout and "kv_cache_dtype: declared 'float32', runs 'bfloat16'  (engine)" in result.stdout
    assert "1 of 1 running engine(s) differ" in result.stderr and "chat-0" in result.stderr

    as_json = fleet.run("class", "diff", "--live", CHAT, "-o", "json", role="viewer")
    assert as_json.exit_code == 7
    (engine,) = json.loads(as_json.stdout)
    assert engine["drift"] == [{"field": "kv_cache_dtype", "declared": "float32", "actual": "bfloat16", "source": "engine"}]

    listed = ok(fleet.run("engine", "list", role="viewer")).stdout.splitlines()
    assert "DRIFT" in listed[0] and listed[1].split()[-1] == "kv_cache_dtype"
    status = ok(fleet.run("status", role="viewer")).stdout
    assert "drift: 1 engine(s) run a config that differs from their class revision" in status


def test_no_drift_is_exit_0(fleet: Fleet, tmp_path: Path) -> None:
    run_engine(fleet, tmp_path, "float32")
    result = ok(fleet.run("class", "diff", "--live", CHAT, role="viewer"))
    assert "all 1 running engine(s) run their class revision" in result.stderr
    empty = ok(fleet.run("class", "diff", "--live", "no-such-model", "-o", "json", role="viewer"))
    assert json.loads(empty.stdout) == [] and "no running engines" in empty.stderr
    assert "drift:" not in ok(fleet.run("status", role="viewer")).stdout


def test_diff_without_live_is_a_usage_error(fleet: Fleet) -> None:
    result = fleet.run("class", "diff", CHAT)
    assert result.exit_code == 2 and "--live" in one_error_line(result)
