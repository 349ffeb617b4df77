"""The node's tiers on the heartbeat: what they report to the controller and what the controller tells them.

Each beat carries the tiers' report rows (`kv_tiers`) and the last flush carried out (`kv_flushed`, on every
beat until the agent restarts, so the controller can acknowledge it whenever its write lands). Each reply
carries `kv` (engine.contract.kv_tier_report.KVDirectives): the kv_tier_disk flag, applied at once to every
store (a reference engine's next offload or fetch sees it; a vLLM engine's own disk tier changes when it is
next launched), and a flush, carried out once per id however many replies repeat it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from agent.kv_tiers.registry import TierRegistry

log = logging.getLogger("fleetctl.agent.kv_tiers")


class TierControl:
    def __init__(self, registry: TierRegistry):
        self.registry = registry
        self.last_flush: dict[str, Any] | None = None  # {"id", "dropped": {class: blocks}}

    def beat_fields(self) -> dict[str, Any]:
        return {"kv_tiers": self.registry.reports(), "kv_flushed": self.last_flush}

    async def apply(self, kv: Any) -> None:
        """Take a reply's `kv` (None: a controller that sends none, which changes nothing)."""
        if kv is None:
            return
        disk = bool(getattr(kv, "disk", True))
        if disk != self.registry.disk_enabled:
            log.warning("KV tiers: disk tiers %s (the kv_tier_disk flag)", "on" if disk else "off")
            self.registry.set_disk_enabled(disk)
        flush = getattr(kv, "flush", None)
        if flush is None or (self.last_flush is not None and self.last_flush["id"] == flush.id):
            return
        log.warning("KV tier flush %d from the controller: class %s, tier %s", flush.id,
                    flush.class_name or "all", flush.tier or "all")
        try:
            dropped = await asyncio.to_thread(self.registry.flush, flush.class_name, flush.tier)
        except OSError as exc:  # the disk refused: not done, so the next reply asks again
            log.error("KV tier flush %d failed: %s", flush.id, exc)
            return
        self.last_flush = {"id": flush.id, "dropped": dropped}
