"""A node's KV tiers at the controller: what its agent reports on each beat (`nodes.kv_tiers`), and the
operator's flush, which travels to the agent in the heartbeat reply.

A flush is asked for here (`request_flush`: stored on the node as `kv_flush`, with an id new for the node)
and its node's generation advanced, so the cached heartbeat reply is rebuilt and the next beat carries it
(`KVDirectives.flush`). The agent carries it out once per id and reports it done on every beat after
(`kv_flushed`); the beat that first reports the pending id done clears it (`acknowledge_flush`), records
what was dropped, and advances the generation again so the reply stops carrying it. An agent that restarts
before it reports the flush done gets it again: flushing twice drops what was offloaded in between, nothing
worse. The kv_tier_disk flag travels beside it in every reply (`KVDirectives.disk`).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from engine.contract.kv_tier_report import KVDirectives, KVFlushDone, KVFlushRequest
from fleetctl.controller import flags
from fleetctl.controller.contract import HeartbeatRequest
from fleetctl.controller.models import Node

DISK_FLAG = "kv_tier_disk"


def tier_rows(req: HeartbeatRequest) -> list[dict[str, Any]]:
    """The beat's tier reports as the nodes.kv_tiers column stores them."""
    return [tier.model_dump(mode="json") for tier in req.kv_tiers]


def request_flush(node: Node, class_name: str | None, tier: str | None, actor: str, reason: str | None,
                  now: datetime) -> dict[str, Any]:
    """Ask the node's agent to flush (a class's, or every class's) tiers (one tier, or both). Replaces a
    flush not yet carried out. Returns the stored request."""
    last = max((entry or {}).get("id", 0) for entry in (node.kv_flush, node.kv_flushed))
    request = {"id": last + 1, "class_name": class_name, "tier": tier, "by": actor, "reason": reason,
               "at": now.isoformat()}
    node.kv_flush = request
    node.generation += 1  # the cached heartbeat reply is rebuilt with it
    return request


def acknowledge_flush(session: Session, node_name: str, done: KVFlushDone, now: datetime) -> bool:
    """The agent says flush `done.id` is done: clear it if it is the one pending. True if it was."""
    node = session.get(Node, node_name)
    if node is None or node.kv_flush is None or node.kv_flush.get("id") != done.id:
        return False
    session.execute(update(Node).where(Node.name == node_name).values(
        kv_flush=None, generation=Node.generation + 1,
        kv_flushed={**node.kv_flush, "dropped": dict(done.dropped), "done_at": now.isoformat()}))
    session.expire(node)
    return True


def disk_enabled(session: Session, now: datetime) -> bool:
    return bool(flags.flag_value(session, DISK_FLAG, now))


def directives_json(disk: bool, kv_flush: dict[str, Any] | None) -> str:
    """The reply's `kv` object, serialised (the heartbeat reply is assembled from cached strings)."""
    flush = KVFlushRequest.model_validate(kv_flush) if kv_flush else None
    return json.dumps(KVDirectives(disk=disk, flush=flush).model_dump(mode="json"), separators=(",", ":"))
