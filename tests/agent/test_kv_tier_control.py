"""The node's tiers on the heartbeat (agent.kv_tiers.control): each beat reports every class's tiers in the
controller's TierReport shape; a reply's kv_tier_disk flag turns the disk tiers off and on; a flush runs
once per id, however many replies repeat it, and is reported done on every beat after."""

from __future__ import annotations

import asyncio

from test_kv_tiers import block

from agent.kv_tiers.control import TierControl
from agent.kv_tiers.registry import TierRegistry
from engine.contract.kv_tier_report import KVDirectives, KVFlushRequest, TierReport

TIERS = {"dram_mib": 1, "disk_mib": 4}


def registry_with_blocks(tmp_path, count: int = 3) -> TierRegistry:
    registry = TierRegistry(tmp_path)
    registry.ensure("chat", TIERS).offload([block(n) for n in range(count)])
    registry.ensure("code", {"dram_mib": 1}).offload([block(100)])
    return registry


def test_a_beat_reports_every_class_and_tier_in_the_controllers_shape(tmp_path):
    control = TierControl(registry_with_blocks(tmp_path))
    fields = control.beat_fields()
    reports = [TierReport.model_validate(row) for row in fields["kv_tiers"]]
    assert [(r.class_name, r.tier, r.medium, r.blocks) for r in reports] == [
        ("chat", "dram", "CPU", 3), ("chat", "disk", "STORAGE", 0), ("code", "dram", "CPU", 1)]
    assert reports[0].offloaded == 3 and fields["kv_flushed"] is None


def test_the_disk_flag_turns_every_disk_tier_off_and_on(tmp_path):
    registry = registry_with_blocks(tmp_path)
    control = TierControl(registry)
    asyncio.run(control.apply(KVDirectives(disk=False)))
    assert registry.disk_enabled is False and registry.get("chat").disk_enabled is False
    assert [r["enabled"] for r in control.beat_fields()["kv_tiers"] if r["tier"] == "disk"] == [False]
    asyncio.run(control.apply(None))  # a controller that sends no `kv` changes nothing
    assert registry.disk_enabled is False
    asyncio.run(control.apply(KVDirectives(disk=True)))
    assert registry.get("chat").disk_enabled is True


def test_a_flush_runs_once_per_id_and_is_reported_done(tmp_path):
    registry = registry_with_blocks(tmp_path)
    control = TierControl(registry)
    asyncio.run(control.apply(KVDirectives(flush=KVFlushRequest(id=1, class_name="chat"))))
    assert control.beat_fields()["kv_flushed"] == {"id": 1, "dropped": {"chat": 3}}
    assert len(registry.get("chat").dram) == 0 and len(registry.get("code").dram) == 1
    registry.get("chat").offload([block(7)])
    asyncio.run(control.apply(KVDirectives(flush=KVFlushRequest(id=1, class_name="chat"))))  # a repeated reply
    assert len(registry.get("chat").dram) == 1
    asyncio.run(control.apply(KVDirectives(flush=KVFlushRequest(id=2, tier="dram"))))
    assert control.beat_fields()["kv_flushed"] == {"id": 2, "dropped": {"chat": 1, "code": 1}}


def test_a_flush_of_a_class_the_node_does_not_hold_drops_nothing(tmp_path):
    control = TierControl(registry_with_blocks(tmp_path))
    asyncio.run(control.apply(KVDirectives(flush=KVFlushRequest(id=4, class_name="absent"))))
    assert control.beat_fields()["kv_flushed"] == {"id": 4, "dropped": {}}
    assert [r["blocks"] for r in control.beat_fields()["kv_tiers"] if r["tier"] == "dram"] == [3, 1]
