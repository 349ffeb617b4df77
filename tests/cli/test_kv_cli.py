"""`fleetctl kv status|flush` against a real controller (SQLite and PostgreSQL), with the agent's own tier
control (agent.kv_tiers.control over a real TierRegistry) reporting and taking directives through real HTTP
heartbeats: the status table and its JSON, a flush carried out and waited for, and bad input refused with one
line and its exit code."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from cli_helpers import Fleet, ok, one_error_line
from traffic_helpers import agent

from agent.kv_tiers.control import TierControl
from agent.kv_tiers.registry import TierRegistry
from engine.contract.kv_tier import TierBlock, kv_layout_key
from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.kv_cmd import tier_rows

LAYOUT = kv_layout_key(weights="tiny", weights_revision="main", dtype="float32", kv_cache_dtype="float32",
                       rope_scaling=None, block_size=4, block_shape=[2, 2, 4, 1, 8])


def tiers_with_blocks(root: Path) -> TierRegistry:
    registry = TierRegistry(root)
    blocks = [TierBlock.make(LAYOUT, n, (n, n + 1, n + 2, n + 3), bytes(64)) for n in range(3)]
    registry.ensure("chat", {"dram_mib": 1, "disk_mib": 2}).offload(blocks)
    return registry


def agent_with_tiers(fleet: Fleet, node: str, registry: TierRegistry) -> Any:
    """Real heartbeats carrying the registry's reports; each reply's `kv` applied by the agent's TierControl."""
    return agent(fleet, node, engines=1, tiers=TierControl(registry))


def wait_reported(fleet: Fleet, node: str) -> None:
    with fleet.client() as client:
        for _ in range(200):
            if client.get_node(node).kv_tiers:
                return
            threading.Event().wait(0.05)
    raise AssertionError(f"node {node} reported no tiers")


def test_status_shows_each_tier_and_a_flush_is_carried_out_and_waited_for(fleet: Fleet, tmp_path: Path) -> None:
    registry = tiers_with_blocks(tmp_path / "tiers")
    with agent_with_tiers(fleet, "n1", registry):
        wait_reported(fleet, "n1")
        table = ok(fleet.run("kv", "status", role="viewer")).stdout
        assert "NODE" in table and "chat" in table and "dram" in table and "disk" in table
        rows = json.loads(ok(fleet.run("kv", "status", "n1", "-o", "json", role="viewer")).stdout)
        assert [(r["node"], r["class_name"], r["tier"], r["blocks"], r["enabled"]) for r in rows] == [
            ("n1", "chat", "dram", 3, True), ("n1", "chat", "disk", 0, True)]
        result = ok(fleet.run("kv", "flush", "n1", "--class", "chat", "--tier", "dram", "--yes", "--reason", "test",
                              "--timeout", "30", role="operator"))
        assert "node n1: flushed, 3 block(s) dropped (chat 3)" in result.stderr
        assert len(registry.get("chat").dram) == 0
    with fleet.client() as client:
        node = client.get_node("n1")
        assert node.kv_flush is None and node.kv_flushed.id == 1 and node.kv_flushed.tier == "dram"


def test_bad_flushes_fail_with_one_line_and_their_exit_code(fleet: Fleet, tmp_path: Path) -> None:
    with agent_with_tiers(fleet, "n1", tiers_with_blocks(tmp_path / "tiers")):
        wait_reported(fleet, "n1")
        cases = [(["kv", "flush", "ghost", "--yes"], "operator", ExitCode.NOT_FOUND, "ghost"),
                 (["kv", "flush", "n1", "--class", "Not_A_Class", "--yes"], "operator", ExitCode.USAGE, "class_name"),
                 (["kv", "flush", "n1", "--yes"], "viewer", ExitCode.AUTH, "operator")]
        for args, role, code, named in cases:
            result = fleet.run(*args, role=role)
            assert result.exit_code == code, (args, result.output)
            assert named in one_error_line(result)
        result = fleet.run("kv", "flush", "n1", "--tier", "ssd", "--yes", role="operator")
        assert result.exit_code == ExitCode.USAGE and "ssd" in result.output
        with fleet.client() as client:
            assert client.get_node("n1").kv_flush is None


def test_a_node_without_tiers_has_no_rows() -> None:
    assert tier_rows([{"name": "n1", "state": "up", "kv_tiers": []}], []) == []


def test_offloads_dropped_are_summed_per_node_and_class_from_the_engines() -> None:
    tier = {"class_name": "chat", "tier": "dram", "medium": "CPU", "enabled": True, "capacity_bytes": 1, "used_bytes": 0,
            "blocks": 0, "hits": 2, "misses": 6, "fetch_seconds_sum": 0.5, "fetches": 2, "corrupt": 0, "offloaded": 4,
            "refused": 0}
    engines = [{"node": "n1", "class_ref": "chat@r1", "metrics": {"kv_tier_offload_dropped": 5}},
               {"node": "n1", "class_ref": "chat@r2", "metrics": {"kv_tier_offload_dropped": 2}},
               {"node": "n2", "class_ref": "chat@r1", "metrics": {"kv_tier_offload_dropped": 100}},
               {"node": "n1", "class_ref": "code@r1", "metrics": {}}]
    (row,) = tier_rows([{"name": "n1", "state": "up", "kv_tiers": [tier]}], engines)
    assert (row["offload_dropped"], row["hit_rate"], row["mean_fetch_s"]) == (7, 0.25, 0.25)
