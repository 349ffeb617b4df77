"""The P/D K/V frame and the bookkeeping around it, without processes: round trips, every kind of damage a
receiver must refuse, held blocks on the prefill side and staged blocks on the decode side."""

from __future__ import annotations

import json
import struct
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InvalidRequest
from engine.reference.kv_transfer import (
    HeldBlocks,
    KVFrame,
    KVFrameError,
    KVStaging,
    decode_frame,
    encode_frame,
    prompt_hash,
)

LAYERS, HEADS, DIM, BS = 2, 2, 4, 4
BLOCK_SHAPE = (LAYERS, 2, BS, HEADS, DIM)


def blocks(n: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((LAYERS, 2, n, BS, HEADS, DIM), generator=gen).to(dtype)  # [layers, 2, n, bs, h, d]


def header_of(frame: bytes) -> dict:
    (length,) = struct.unpack_from("!I", frame)
    return json.loads(frame[4 : 4 + length])


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 5), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       indices_seed=st.integers(0, 1000))
def test_round_trip_is_bit_exact(n: int, dtype: torch.dtype, indices_seed: int) -> None:
    kv = blocks(n, dtype, indices_seed)
    indices = [indices_seed + 3 * i for i in range(n)]
    frame = decode_frame(encode_frame("req-1", indices, kv), dtype, BLOCK_SHAPE)
    assert frame.request_id == "req-1" and frame.block_indices == indices
    assert frame.kv.dtype == dtype and torch.equal(frame.kv, kv)


def test_header_describes_the_payload() -> None:
    data = encode_frame("r", [0, 1], blocks(2))
    header = header_of(data)
    assert header["block_shape"] == list(BLOCK_SHAPE) and header["dtype"] == "float32"
    assert header["nbytes"] == 2 * LAYERS * 2 * BS * HEADS * DIM * 4
    assert len(data) == 4 + len(json.dumps(header)) + header["nbytes"]


def test_every_flipped_payload_byte_is_caught() -> None:
    data = encode_frame("r", [0], blocks(1))
    payload_start = len(data) - header_of(data)["nbytes"]
    for offset in range(payload_start, len(data), 7):
        damaged = bytearray(data)
        damaged[offset] ^= 0x01
        with pytest.raises(KVFrameError) as err:
            decode_frame(bytes(damaged), torch.float32, BLOCK_SHAPE)
        assert err.value.reason == "checksum"


@settings(max_examples=50, deadline=None)
@given(cut=st.integers(0, 2000))
def test_every_truncation_is_caught(cut: int) -> None:
    data = encode_frame("r", [0, 1], blocks(2))
    cut = min(cut, len(data) - 1)
    with pytest.raises(KVFrameError):
        decode_frame(data[:cut], torch.float32, BLOCK_SHAPE)


@pytest.mark.parametrize("garbage", [b"", b"\x00\x00", b"hello world", b"\x00\x00\x00\x05{{{{{", b"\xff" * 64,
                                     b"\x00\x00\x00\x02[]"])
def test_garbage_is_refused(garbage: bytes) -> None:
    with pytest.raises(KVFrameError):
        decode_frame(garbage, torch.float32, BLOCK_SHAPE)


def test_wrong_dtype_or_shape_is_refused() -> None:
    data = encode_frame("r", [0], blocks(1))
    with pytest.raises(KVFrameError) as err:
        decode_frame(data, torch.bfloat16, BLOCK_SHAPE)
    assert err.value.reason == "dtype"
    with pytest.raises(KVFrameError) as err:
        decode_frame(data, torch.float32, (LAYERS, 2, BS, HEADS * 2, DIM // 2))
    assert err.value.reason == "shape"


def test_a_header_lying_about_the_block_count_is_refused() -> None:
    data = encode_frame("r", [0, 1], blocks(2))
    header = header_of(data)
    payload = data[4 + len(json.dumps(header)):]
    header["block_indices"] = [0]  # one block announced, two sent (checksum still right)
    raw = json.dumps(header).encode()
    with pytest.raises(KVFrameError) as err:
        decode_frame(struct.pack("!I", len(raw)) + raw + payload, torch.float32, BLOCK_SHAPE)
    assert err.value.reason == "shape"


def test_prompt_hash_tells_prompts_apart() -> None:
    assert prompt_hash([1, 2, 3]) == prompt_hash([1, 2, 3])
    assert prompt_hash([1, 2, 3]) != prompt_hash([1, 2, 4])


# --- held blocks (prefill side) ------------------------------------------------------------------------


def test_held_blocks_map_physical_ids_to_logical_indices() -> None:
    held = HeldBlocks(ttl_s=60)
    held.add("r", [40, 7, 12])
    assert held.logical_indices("r", [12, 40]) == [2, 0]
    with pytest.raises(InvalidRequest):
        held.logical_indices("r", [13])  # not this request's block: never export someone else's K/V
    with pytest.raises(KeyError):
        held.logical_indices("other", [40])
    assert held.pop("r") and len(held) == 0


def test_held_blocks_expire() -> None:
    held = HeldBlocks(ttl_s=0.0)
    held.add("r", [1])
    time.sleep(0.01)
    with pytest.raises(KeyError):
        held.logical_indices("r", [1])


# --- staged blocks (decode side) -----------------------------------------------------------------------


def frame(request_id: str, indices: list[int], seed: int = 0) -> KVFrame:
    return KVFrame(request_id, indices, blocks(len(indices), seed=seed))


def test_staging_returns_pushed_blocks_by_index_and_forgets_the_request() -> None:
    staging = KVStaging(ttl_s=60, max_blocks=100)
    f0, f1 = frame("r", [0], seed=1), frame("r", [1, 2], seed=2)
    staging.put(f0)
    staging.put(f1)
    staging.put(frame("other", [0]))
    got = staging.take("r", range(2))
    assert sorted(got) == [0, 1]
    assert torch.equal(got[0], f0.block(0)) and torch.equal(got[1], f1.block(0))
    assert staging.take("r", range(3)) == {}  # block 2 went with the request
    assert len(staging) == 1


def test_staging_expires_and_is_bounded() -> None:
    staging = KVStaging(ttl_s=0.0, max_blocks=100)
    staging.put(frame("r", [0]))
    time.sleep(0.01)
    assert staging.take("r", range(1)) == {}
    bounded = KVStaging(ttl_s=60, max_blocks=3)
    bounded.put(frame("old", [0, 1]))
    bounded.put(frame("new", [0, 1]))
    assert bounded.take("old", range(2)) == {} and sorted(bounded.take("new", range(2))) == [0, 1]
