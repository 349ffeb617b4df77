"""Response models of the nodes' KV tiers (responses.py's terms): each tier as its node's agent last reported
it, a flush asked for, and one carried out."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from engine.contract.kv_tier_report import TierReport


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore")


class NodeTierView(TierReport):
    """One tier as its node's agent last reported it; counters are since the agent started."""


class KVFlushView(_Response):
    id: int = Field(description="the flush's number on its node")
    class_name: str | None = Field(default=None, description="the class whose tiers it drops; null: every class's")
    tier: str | None = Field(default=None, description="dram | disk; null: both")
    by: str | None = Field(default=None, description="who asked for it")
    reason: str | None = Field(default=None, description="why")
    at: str | None = Field(default=None, description="when it was asked for")
    dropped: dict[str, int] | None = Field(default=None, description="once done: blocks dropped, by class")
    done_at: str | None = Field(default=None, description="once done: when the controller heard so")


class KVFlushAccepted(_Response):
    node: str = Field(description="the node whose agent carries it out on its next heartbeat")
    flush: KVFlushView = Field(description="the flush asked for (it replaces one not yet carried out)")
