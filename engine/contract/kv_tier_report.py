"""`TierReport`: one KV tier of one replica class on a node, as the agent reports it on every heartbeat.

The agent builds these from its tier stores (agent/kv_tiers); the controller stores a node's latest list
and serves it with the node (`fleetctl kv status`). Counters are since the agent started (a restart
restarts them; the disk tier's blocks survive it, its counters do not). Every figure is bounded like the
other heartbeat fields, so what validates can be stored; unknown fields are ignored, so a newer agent can
talk to an older controller.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.contract.bounds import Count, NonNegative, bounded_text

MAX_TIER_REPORTS = 256  # classes x tiers on one node
CLASS_NAME_MAX = 63

ClassName = bounded_text(CLASS_NAME_MAX, non_blank=True)
TierName = Literal["dram", "disk"]
TierMedium = Literal["CPU", "STORAGE"]  # vLLM's KV-event vocabulary for where a block is held


class TierReport(BaseModel):
    model_config = ConfigDict(extra="ignore")

    class_name: ClassName = Field(description="the replica class whose tier this is (its engines on the node share it)")
    tier: TierName = Field(description="dram | disk")
    medium: TierMedium = Field(description="where vLLM's KV events say such a block is: CPU (dram) | STORAGE (disk)")
    enabled: bool = Field(description="false: configured but off (the disk tier under the kv_tier_disk flag)")
    capacity_bytes: Count = Field(description="the tier's size limit")
    used_bytes: Count = Field(description="bytes of blocks held")
    blocks: Count = Field(description="blocks held")
    hits: Count = Field(description="blocks found by fetches (counter)")
    misses: Count = Field(description="blocks asked for and not held (counter)")
    fetch_seconds_sum: NonNegative = Field(description="seconds the tier spent reading fetched blocks (counter)")
    fetches: Count = Field(description="fetches that read this tier (counter)")
    corrupt: Count = Field(default=0, description="blocks dropped for a bad checksum (counter)")
    offloaded: Count = Field(default=0, description="blocks the class's engines offloaded to the node, both tiers "
                                                    "(counter)")
    refused: Count = Field(default=0, description="offloaded blocks no tier took, both tiers (counter)")

    @property
    def hit_rate(self) -> float | None:
        looked = self.hits + self.misses
        return self.hits / looked if looked else None

    @property
    def mean_fetch_s(self) -> float | None:
        return self.fetch_seconds_sum / self.fetches if self.fetches else None


class KVFlushRequest(BaseModel):
    """An operator's flush of a node's tiers (`fleetctl kv flush`), sent in the heartbeat reply until the
    agent reports it done. `id` is unique per node; None class or tier: all of them."""

    model_config = ConfigDict(extra="ignore")

    id: Count
    class_name: ClassName | None = None
    tier: TierName | None = None


class KVFlushDone(BaseModel):
    """The agent's account of the last flush it carried out, on every beat until it restarts."""

    model_config = ConfigDict(extra="ignore")

    id: Count
    dropped: dict[ClassName, Count] = Field(default_factory=dict, max_length=MAX_TIER_REPORTS,
                                            description="blocks dropped, by class")


class KVDirectives(BaseModel):
    """What the controller tells a node's agent about its tiers in each heartbeat reply."""

    model_config = ConfigDict(extra="ignore")

    disk: bool = Field(default=True, description="the kv_tier_disk flag: false turns every disk tier off")
    flush: KVFlushRequest | None = None
