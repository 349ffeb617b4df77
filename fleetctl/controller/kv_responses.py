"""Response models of the nodes' KV tiers (responses.py's terms): each tier as its node's agent last reported
it, a flush asked for, and one carried out."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore")


class NodeTierView(_Response):
    class_name: str = Field(description="the replica class whose tier this is (a class's engines on a node share it)")
    tier: str = Field(description="dram | disk")
    medium: str = Field(description="where vLLM's KV events say the block is: CPU (dram) | STORAGE (disk)")
    enabled: bool = Field(description="false: configured but off (the disk tier under the kv_tier_disk flag)")
    capacity_bytes: int = Field(description="the tier's size limit")
    used_bytes: int = Field(description="bytes of blocks held")
    blocks: int = Field(description="blocks held")
    hits: int = Field(description="blocks found by fetches, since the agent started")
    misses: int = Field(description="blocks asked for and not held, since the agent started")
    fetch_seconds_sum: float = Field(description="seconds the tier spent reading fetched blocks, since the agent "
                                                 "started")
    fetches: int = Field(description="fetches that read this tier, since the agent started")
    corrupt: int = Field(default=0, description="blocks dropped for a bad checksum, since the agent started")
    offloaded: int = Field(default=0, description="blocks the class's engines offloaded to the node (both tiers)")
    refused: int = Field(default=0, description="offloaded blocks no tier took (both tiers)")

    @property
    def hit_rate(self) -> float | None:
        looked = self.hits + self.misses
        return self.hits / looked if looked else None

    @property
    def mean_fetch_s(self) -> float | None:
        return self.fetch_seconds_sum / self.fetches if self.fetches else None


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
