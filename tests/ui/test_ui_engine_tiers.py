"""The engine detail's KV tier line: the engine's class's tiers on its node, none when it has none."""

from __future__ import annotations

from fleetctl.controller.responses import NodeTierView
from fleetctl.controller.responses import NodeCapacity, NodeView
from ui.screens.engine import tiers_text

MIB = 1 << 20


def tier(class_name: str, name: str, **figures: int | float | bool) -> NodeTierView:
    values = {"enabled": True, "capacity_bytes": 128 * MIB, "used_bytes": 32 * MIB, "blocks": 340, "hits": 45,
              "misses": 55, "fetch_seconds_sum": 0.02, "fetches": 40, **figures}
    return NodeTierView(class_name=class_name, tier=name, medium="CPU" if name == "dram" else "STORAGE", **values)


def node(tiers: list[NodeTierView]) -> NodeView:
    return NodeView(name="node-3", url="http://node-3", state="up", cordoned=False, draining=False, labels={},
                    capacity=NodeCapacity(engines=4, kv_mib=1024), agent_version="t", engines=1,
                    last_heartbeat_at="2026-12-06T00:00:00+00:00", heartbeat_age_s=1.0, generation=1,
                    applied_generation=1, cut_off_s=None, registered_at="2026-12-06T00:00:00+00:00", kv_tiers=tiers)


def test_the_line_shows_the_engines_class_tiers_only():
    line = tiers_text(node([tier("chat", "dram"), tier("chat", "disk", enabled=False), tier("code", "dram")]), "chat")
    assert line is not None
    text = line.plain
    assert text.startswith("KV tiers of chat on node-3: dram 32/128 MiB, 340 blocks, hit 45")
    assert "disk (off)" in text and "code" not in text


def test_no_line_without_tiers_for_the_class_or_without_the_node():
    assert tiers_text(node([tier("code", "dram")]), "chat") is None
    assert tiers_text(None, "chat") is None
