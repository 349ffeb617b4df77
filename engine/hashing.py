"""Prefix-block hashing, identical to vLLM v1 with `--prefix-caching-hash-algo sha256_cbor`.

A prompt is split into blocks of `block_size` tokens; only full blocks are hashed. Block i's hash is

    sha256(cbor2.dumps((parent_hash or NONE_HASH, tuple(block_token_ids), extra_keys), canonical=True))

and NONE_HASH = sha256_cbor(seed), the seed being the *string* vLLM reads from PYTHONHASHSEED, or, when that is
unset and the hash is cryptographic (sha256, sha256_cbor), the fixed string "vllm-none-hash"
(kv_cache_utils.DEFAULT_NONE_HASH_SEED). The fleet's default seed is that string, so a stock vLLM started with
`--prefix-caching-hash-algo sha256_cbor` and no PYTHONHASHSEED hashes as the fleet does. Every process that
agrees on the seed agrees on every hash, so the gateway's index matches what engines hold.
Events and indexes carry the low 64 bits of the digest as an unsigned int (`to_int64`), as vLLM does
with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import cbor2

DEFAULT_BLOCK_SIZE = 16
VLLM_DEFAULT_HASH_SEED = "vllm-none-hash"  # what vLLM derives NONE_HASH from when PYTHONHASHSEED is unset
DEFAULT_HASH_SEED = VLLM_DEFAULT_HASH_SEED
LEGACY_HASH_SEED = "0"  # the fleet's default before it took vLLM's: fleets started then keep it
HASH_SEED_ENV = "FLEET_HASH_SEED"

BlockHash = bytes


def sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


@lru_cache(maxsize=16)
def none_hash(seed: str = DEFAULT_HASH_SEED) -> BlockHash:
    """The parent hash of a prompt's first block."""
    return sha256_cbor(seed)


def default_seed() -> str:
    """The seed every fleet process uses unless told otherwise (FLEET_HASH_SEED, else vLLM's default)."""
    return os.environ.get(HASH_SEED_ENV, DEFAULT_HASH_SEED)


def hash_block_tokens(
    parent: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: tuple | None = None,
    seed: str = DEFAULT_HASH_SEED,
) -> BlockHash:
    return sha256_cbor((parent if parent is not None else none_hash(seed), tuple(token_ids), extra_keys))


def block_hashes(
    token_ids: Sequence[int],
    block_size: int = DEFAULT_BLOCK_SIZE,
    seed: str = DEFAULT_HASH_SEED,
    parent: BlockHash | None = None,
) -> list[BlockHash]:
    """Chained hashes of every full block of `token_ids` (a trailing partial block is not hashed)."""
    hashes: list[BlockHash] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size], None, seed)
        hashes.append(parent)
    return hashes


def to_int64(block_hash: BlockHash) -> int:
    """The low 64 bits of a digest, as vLLM puts them in KV events."""
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)


def block_hashes_int64(
    token_ids: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE, seed: str = DEFAULT_HASH_SEED
) -> list[int]:
    return [to_int64(h) for h in block_hashes(token_ids, block_size, seed)]
