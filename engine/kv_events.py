"""KV cache events in vLLM's wire format, so the gateway's prefix index works with real vLLM engines too.

Wire form (vllm/distributed/kv_events.py): ZMQ PUB multipart frames
    [topic bytes, 8-byte big-endian sequence number, msgpack payload]
where the payload is an EventBatch encoded as an array `[ts, [event, ...], dp_rank]`.
Since vLLM PR #42892 events are maps tagged by `type` ({"type": "BlockStored", "block_hashes": [...], ...});
before it they were positional arrays (["BlockStored", [hashes], parent, [tokens], block_size, ...]).
We publish the map form and decode both.

Replay: a ROUTER socket; a client sends the 8-byte start sequence number and receives
(empty, seq bytes, payload) frames for every buffered batch at or after it, then END_SEQ with an empty payload.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Union

import msgpack

END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = "GPU"
    lora_name: str | None = None


@dataclass
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None = "GPU"


@dataclass
class AllBlocksCleared:
    pass


KVEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


@dataclass
class EventBatch:
    ts: float
    events: list[KVEvent] = field(default_factory=list)
    data_parallel_rank: int | None = None


def _event_to_map(event: KVEvent) -> dict:
    body = {"type": type(event).__name__}
    body.update(event.__dict__)
    return body


def encode_batch(batch: EventBatch) -> bytes:
    return msgpack.packb([batch.ts, [_event_to_map(e) for e in batch.events], batch.data_parallel_rank])


def _event_from_map(raw: dict) -> KVEvent | None:
    kind = raw.get("type")
    if kind == "BlockStored":
        return BlockStored(
            block_hashes=list(raw["block_hashes"]),
            parent_block_hash=raw.get("parent_block_hash"),
            token_ids=list(raw.get("token_ids") or []),
            block_size=int(raw.get("block_size") or 0),
            lora_id=raw.get("lora_id"),
            medium=raw.get("medium"),
            lora_name=raw.get("lora_name"),
        )
    if kind == "BlockRemoved":
        return BlockRemoved(block_hashes=list(raw["block_hashes"]), medium=raw.get("medium"))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None  # an event type from a newer vLLM: ignore rather than fail the batch


def _event_from_array(raw: list) -> KVEvent | None:
    kind, rest = raw[0], raw[1:]
    if isinstance(kind, bytes):
        kind = kind.decode()
    if kind == "BlockStored":
        hashes, parent, tokens, block_size = rest[0], rest[1], rest[2], rest[3]
        medium = rest[5] if len(rest) > 5 else None
        return BlockStored(list(hashes), parent, list(tokens), int(block_size), medium=medium)
    if kind == "BlockRemoved":
        return BlockRemoved(list(rest[0]), medium=rest[1] if len(rest) > 1 else None)
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _normalise_hash(value):
    """Events may carry raw digests (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0): reduce them to the low 64 bits."""
    if isinstance(value, (bytes, bytearray)):
        return int.from_bytes(value, "big") & ((1 << 64) - 1)
    return value


def decode_event(raw) -> KVEvent | None:
    event = _event_from_map(raw) if isinstance(raw, dict) else _event_from_array(list(raw))
    if isinstance(event, (BlockStored, BlockRemoved)):
        event.block_hashes = [_normalise_hash(h) for h in event.block_hashes]
    if isinstance(event, BlockStored) and event.parent_block_hash is not None:
        event.parent_block_hash = _normalise_hash(event.parent_block_hash)
    return event


def decode_batch(payload: bytes) -> EventBatch:
    raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    ts, events = raw[0], raw[1]
    dp_rank = raw[2] if len(raw) > 2 else None
    decoded = [e for e in (decode_event(r) for r in events) if e is not None]
    return EventBatch(ts=ts, events=decoded, data_parallel_rank=dp_rank)


def make_batch(events: list[KVEvent]) -> EventBatch:
    return EventBatch(ts=time.time(), events=events, data_parallel_rank=0)
