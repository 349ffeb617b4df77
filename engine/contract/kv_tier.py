"""What an engine and its node's KV tiers agree on: how a block is addressed, what it carries, and its bytes.

Address. A tier block is found by (layout, block hash). The block hash is the engine's own prefix hash (the
low 64 bits of vLLM's sha256_cbor chain, engine.hashing), so tiers, engines and the gateway's index share one
addressing scheme. The layout is a digest of everything that decides what the K/V bytes of a token run mean:
the weights, their dtype, the KV dtype, RoPE scaling, the block size and the per-block tensor shape. Two
engines share a tier's blocks only when their layouts are equal, so a block from a differently configured
class (a float16 KV cache, a long-context RoPE build) is never loaded: its key is another one.

Block. Its token ids travel with it and are compared on every hit, as the engine's own cache does (a 64-bit
hash can collide; the tokens cannot lie), and a CRC-32 covers the address, the tokens and the payload, so a
block corrupted on disk or in transit is detected and recomputed, never used.

Frame (an offload batch, or a fetch answer), little-endian-free and self-describing:

    !I header length | header (UTF-8 JSON) | payload of block 0 | payload of block 1 | ...
    header = {"version": 1, "layout": str, "blocks": [{"hash": int, "tokens": [int], "nbytes": int,
              "checksum": int}, ...]}

The payload is opaque here (the engine's K/V tensor of one block, [layers, 2, block_size, kv_heads, head_dim]
in C order); the tier stores and returns bytes, so the agent needs no torch.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

TIER_TOKEN_ENV = "FLEET_KV_TIER_TOKEN"  # the agent's tier credential, in the environment of the engines it launches
MEDIA_HEADER = "x-fleet-tier-media"  # a fetch answer's header: where each block came from, comma-separated
TIER_FRAME_VERSION = 1
TIER_FRAME_MEDIA_TYPE = "application/x-fleet-kv-tier"
MAX_TIER_HEADER = 1 << 22  # a header lists every block's tokens: 4 MiB is ~2,000 blocks of 16 tokens
LAYOUT_RE = re.compile(r"^[0-9a-f]{16,64}$")
HASH_MAX = (1 << 64) - 1
_U32 = struct.Struct("!I")

# vLLM's vocabulary for where a block is held (kv_events `medium`), and what our tiers are called
MEDIUM_GPU = "GPU"  # the engine's own KV pool (GPU memory for vLLM, the reference engine's pool on CPU)
MEDIUM_CPU = "CPU"  # the node's DRAM tier
MEDIUM_STORAGE = "STORAGE"  # the node's disk tier
TIER_MEDIA = {"dram": MEDIUM_CPU, "disk": MEDIUM_STORAGE}


class TierFrameError(ValueError):
    """A tier frame or block that cannot be trusted; `reason` is the metric label."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def kv_layout_key(*, weights: str, weights_revision: str, dtype: str, kv_cache_dtype: str,
                  rope_scaling: float | None, block_size: int, block_shape: Sequence[int]) -> str:
    """The digest of what decides the meaning of a block's K/V bytes (see the module doc)."""
    fields = {"weights": weights, "weights_revision": weights_revision, "dtype": dtype,
              "kv_cache_dtype": kv_cache_dtype, "rope_scaling": rope_scaling, "block_size": block_size,
              "block_shape": list(block_shape)}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


def valid_layout(layout: object) -> bool:
    return isinstance(layout, str) and LAYOUT_RE.match(layout) is not None


def block_checksum(layout: str, block_hash: int, token_ids: Sequence[int], payload: bytes | memoryview) -> int:
    """CRC-32 over the block's address, tokens and payload (for corruption, not against an adversary)."""
    head = json.dumps([layout, block_hash, list(token_ids)], separators=(",", ":")).encode()
    return zlib.crc32(payload, zlib.crc32(head))


@dataclass(frozen=True)
class TierBlock:
    layout: str
    block_hash: int  # 64-bit, as in KV events
    token_ids: tuple[int, ...]
    payload: bytes
    checksum: int

    @classmethod
    def make(cls, layout: str, block_hash: int, token_ids: Sequence[int], payload: bytes) -> TierBlock:
        tokens = tuple(token_ids)
        return cls(layout, block_hash, tokens, payload, block_checksum(layout, block_hash, tokens, payload))

    @property
    def key(self) -> tuple[str, int]:
        return (self.layout, self.block_hash)

    @property
    def nbytes(self) -> int:
        """What the block costs a tier: its payload (the tokens and header are small beside it)."""
        return len(self.payload)

    def intact(self) -> bool:
        return block_checksum(self.layout, self.block_hash, self.token_ids, self.payload) == self.checksum


def encode_tier_frame(layout: str, blocks: Iterable[TierBlock]) -> bytes:
    blocks = list(blocks)
    if any(b.layout != layout for b in blocks):
        raise ValueError("every block of a frame has the frame's layout")
    header = {"version": TIER_FRAME_VERSION, "layout": layout,
              "blocks": [{"hash": b.block_hash, "tokens": list(b.token_ids), "nbytes": b.nbytes,
                          "checksum": b.checksum} for b in blocks]}
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([_U32.pack(len(head)), head, *(b.payload for b in blocks)])


def decode_tier_frame(data: bytes | memoryview, *, max_blocks: int = 4096) -> tuple[str, list[TierBlock]]:
    """The layout and blocks of a frame, every block checked against its checksum; TierFrameError if the
    frame is malformed or any block is corrupt (a frame is taken whole or not at all)."""
    data = memoryview(data)
    if len(data) < _U32.size:
        raise TierFrameError("truncated", "a tier frame shorter than its length prefix")
    (head_len,) = _U32.unpack(data[: _U32.size])
    if head_len > MAX_TIER_HEADER or _U32.size + head_len > len(data):
        raise TierFrameError("header", f"a {head_len}-byte header in a {len(data)}-byte frame")
    try:
        header = json.loads(bytes(data[_U32.size : _U32.size + head_len]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TierFrameError("header", f"the header is not JSON: {exc}") from None
    layout, entries = _check_header(header, max_blocks)
    offset, blocks = _U32.size + head_len, []
    for entry in entries:
        payload = bytes(data[offset : offset + entry["nbytes"]])
        if len(payload) != entry["nbytes"]:
            raise TierFrameError("truncated", f"block {entry['hash']} has {len(payload)} of {entry['nbytes']} bytes")
        offset += entry["nbytes"]
        block = TierBlock(layout, entry["hash"], tuple(entry["tokens"]), payload, entry["checksum"])
        if not block.intact():
            raise TierFrameError("checksum", f"block {entry['hash']} fails its checksum")
        blocks.append(block)
    if offset != len(data):
        raise TierFrameError("length", f"{len(data) - offset} bytes after the last block")
    return layout, blocks


def _check_header(header: object, max_blocks: int) -> tuple[str, list[dict]]:
    if not isinstance(header, dict) or header.get("version") != TIER_FRAME_VERSION:
        raise TierFrameError("version", f"not a version-{TIER_FRAME_VERSION} tier frame")
    layout, entries = header.get("layout"), header.get("blocks")
    if not valid_layout(layout):
        raise TierFrameError("layout", "layout must be 16-64 lowercase hex digits")
    if not isinstance(entries, list) or len(entries) > max_blocks:
        raise TierFrameError("blocks", f"blocks must be a list of at most {max_blocks}")
    for entry in entries:
        if not _valid_entry(entry):
            raise TierFrameError("blocks", f"a block entry is malformed: {str(entry)[:200]}")
    return layout, entries


def _valid_entry(entry: object) -> bool:
    if not isinstance(entry, dict):
        return False
    ints = [entry.get("hash"), entry.get("nbytes"), entry.get("checksum")]
    tokens = entry.get("tokens")
    return (all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints)
            and entry["hash"] <= HASH_MAX and isinstance(tokens, list)
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens))
