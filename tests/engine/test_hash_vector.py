"""Prefix-block hashes against a fixed vector: the claim "our hashes equal vLLM's" checked against numbers that
did not come from the function under test.

The literals below were computed once by a separate script written from vLLM v1's published scheme
(vllm/v1/core/kv_cache_utils.py `init_none_hash` and `hash_block_tokens`, vllm/utils/hashing.py
`sha256_cbor`), using only hashlib and cbor2:

    import hashlib, cbor2
    def h(x): return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()
    none = h("0")                      # NONE_HASH: the hash of the PYTHONHASHSEED *string*
    tokens = list(range(1000, 1048))   # three full blocks of 16
    parent = none
    for i in range(3):
        parent = h((parent, tuple(tokens[16 * i : 16 * i + 16]), None))
        print(parent.hex(), int.from_bytes(parent, "big") & ((1 << 64) - 1))
    print(h((none, tuple(tokens[:16]), ("my-lora",))).hex())   # a block with extra keys (a LoRA name)

If one of these fails, engine.hashing no longer matches vLLM started with
`--prefix-caching-hash-algo sha256_cbor` and PYTHONHASHSEED=0; do not update the literals to make it pass.
"""

from __future__ import annotations

from engine.hashing import block_hashes, block_hashes_int64, hash_block_tokens, none_hash, to_int64

SEED = "0"
TOKENS = list(range(1000, 1048))

NONE_HASH_HEX = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
BLOCK_HASHES_HEX = [
    "749fdc796f99efd836e0126282116392f5a5e4ea5c7ed009f2f58c385525a1f5",
    "2d5697df551c58c422455b94c9c0db1ddfc2a375c20b0014c82e2a1e69c1d12a",
    "9bc8fffb32c004317d2644e9bb8aea87ba79800dcae35b235e6a96ce6a96239b",
]
BLOCK_HASHES_INT64 = [17507053300047258101, 14424512966625972522, 6803416000392209307]
LORA_BLOCK_HEX = "a9726e8b807739753cd2c7a3652d5fa19632fb6ee8d46c49e8c8420532afe20f"


def test_none_hash_is_the_hash_of_the_seed_string() -> None:
    assert none_hash(SEED).hex() == NONE_HASH_HEX


def test_chained_block_hashes_match_the_vector() -> None:
    assert [h.hex() for h in block_hashes(TOKENS, block_size=16, seed=SEED)] == BLOCK_HASHES_HEX


def test_a_trailing_partial_block_is_not_hashed() -> None:
    assert [h.hex() for h in block_hashes(TOKENS + [1, 2, 3], block_size=16, seed=SEED)] == BLOCK_HASHES_HEX


def test_event_ints_are_the_low_64_bits_of_the_vector() -> None:
    assert block_hashes_int64(TOKENS, block_size=16, seed=SEED) == BLOCK_HASHES_INT64
    assert [to_int64(bytes.fromhex(h)) for h in BLOCK_HASHES_HEX] == BLOCK_HASHES_INT64


def test_extra_keys_enter_the_hash_as_vllm_puts_them() -> None:
    assert hash_block_tokens(None, TOKENS[:16], ("my-lora",), seed=SEED).hex() == LORA_BLOCK_HEX
