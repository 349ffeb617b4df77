"""Where the engine hands K/V blocks off the engine thread: the node's KV tier (the blocks it evicts) and a
decode engine (a prefill's blocks as they are computed). Both are called on the engine thread, so neither
may block."""

from __future__ import annotations

from typing import Protocol

import torch

from engine.reference.block_manager import EvictedBlock


class KVTierSink(Protocol):
    """Takes blocks the pool evicts, for the node's KV tier (engine.reference.kv_tier_client). Called on the
    engine thread, so it must not block: what it cannot take now it does not take."""

    def room(self) -> int: ...  # blocks it would take now

    def offer(self, blocks: list[EvictedBlock], kv: torch.Tensor) -> None: ...  # kv: [layers, 2, n, bs, h, d]

    def skipped(self, count: int) -> None: ...  # evicted blocks it had no room for (counted as dropped)


class KVPushSink(Protocol):
    """Receives a prefill's K/V blocks as they are computed (called on the engine thread)."""

    def push(self, logical_index: int, kv: torch.Tensor) -> None: ...  # kv: [layers, 2, 1, bs, h, d]

    def done(self, num_tokens: int) -> None: ...
