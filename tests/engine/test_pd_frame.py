"""The P/D K/V frame, its raw-TCP side channel, and the bookkeeping around them, without engine processes:
round trips, every kind of damage a receiver must refuse, held blocks on the prefill side and staged blocks
on the decode side."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InvalidRequest
from engine.reference.config import EngineConfig
from engine.reference.kv_decode import KVStaging
from engine.reference.kv_prefill import HeldBlocks, prompt_hash
from engine.reference.kv_side_channel import FrameServer, StreamedFrame, pull_frame
from engine.reference.kv_transfer import KVTransfer
from engine.reference.kv_wire import (
    BufferPool,
    FrameBuffer,
    FrameHeader,
    KVFrame,
    KVFrameError,
    KVPullRefused,
    decode_frame,
    empty_kv,
    encode_frame,
)
from engine.reference.llm_engine import LLMEngine
from engine.contract.sampling_params import SamplingParams

LAYERS, HEADS, DIM, BS = 2, 2, 4, 4
BLOCK_SHAPE = (LAYERS, 2, BS, HEADS, DIM)


def blocks(n: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((LAYERS, 2, n, BS, HEADS, DIM), generator=gen).to(dtype)  # [layers, 2, n, bs, h, d]


def header_of(frame: bytes | memoryview) -> dict:
    (length,) = struct.unpack_from("!I", frame)
    return json.loads(bytes(frame[4 : 4 + length]))


def payload_start(frame: bytes | memoryview) -> int:
    return len(frame) - 4 - header_of(frame)["nbytes"]


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
    kv = blocks(2)
    data = encode_frame("r", [0, 1], kv)
    header = header_of(data)
    assert header["block_shape"] == list(BLOCK_SHAPE) and header["dtype"] == "float32"
    assert header["version"] == 2 and header["checksum"] == "crc32" and header["block_indices"] == [0, 1]
    assert header["nbytes"] == 2 * LAYERS * 2 * BS * HEADS * DIM * 4
    start = payload_start(data)
    assert start % 64 == 0 and start >= 4 + len(json.dumps(header))  # padded: the payload is aligned
    assert bytes(data[start : start + header["nbytes"]]) == kv.numpy().tobytes()
    assert struct.unpack_from("!I", data, len(data) - 4)[0] == zlib.crc32(kv.numpy().tobytes())


def test_decoding_a_writable_buffer_does_not_copy() -> None:
    data = encode_frame("r", [0, 1], blocks(2))
    frame = decode_frame(data, torch.float32, BLOCK_SHAPE)
    assert frame.kv.data_ptr() % 16 == 0  # the payload offset is 64-aligned, the buffer malloc-aligned
    bytes_view = torch.frombuffer(data, dtype=torch.uint8)
    assert frame.kv.data_ptr() == bytes_view.data_ptr() + payload_start(data)  # a view of the frame


def test_every_flipped_payload_or_checksum_byte_is_caught() -> None:
    data = bytes(encode_frame("r", [0], blocks(1)))
    for offset in [*range(payload_start(data), len(data), 7), len(data) - 1]:
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
    data = bytes(encode_frame("r", [0, 1], blocks(2)))
    header = header_of(data)
    header["block_indices"] = [0]  # one block announced, two sent (checksum still right)
    raw = json.dumps(header).encode()
    with pytest.raises(KVFrameError) as err:
        decode_frame(struct.pack("!I", len(raw)) + raw + data[payload_start(data):], torch.float32, BLOCK_SHAPE)
    assert err.value.reason == "shape"


def test_a_version_1_frame_is_refused() -> None:
    payload = blocks(1).numpy().tobytes()
    header = {"version": 1, "request_id": "r", "block_indices": [0], "dtype": "float32",
              "block_shape": list(BLOCK_SHAPE), "nbytes": len(payload), "sha256": "0" * 64}
    raw = json.dumps(header).encode()
    with pytest.raises(KVFrameError) as err:
        decode_frame(struct.pack("!I", len(raw)) + raw + payload + b"\0\0\0\0", torch.float32, BLOCK_SHAPE)
    assert err.value.reason == "header"


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


# --- the side channel (raw TCP, in-process) ---------------------------------------------------------------

EXPECT = FrameHeader.for_blocks("req-1", [0, 1, 2], torch.float32, BLOCK_SHAPE)


def serving(kv: torch.Tensor, header: FrameHeader = EXPECT, sealed: bool = False) -> Callable[[dict], object]:
    """An export callback: the frame streamed (checksummed as it is sent), or a sealed FrameBuffer."""
    def export(request: dict) -> FrameBuffer | StreamedFrame:
        if request["request_id"] != header.request_id:
            raise KVPullRefused(f"no K/V held for request {request['request_id']}")
        if not sealed:
            return StreamedFrame(header, kv)
        frame = FrameBuffer(header, kv.dtype)
        frame.payload.copy_(kv)
        frame.seal()
        return frame
    return export


@pytest.fixture
def frame_server() -> Iterator[Callable[..., FrameServer]]:
    servers: list[FrameServer] = []

    def start(export: Callable) -> FrameServer:
        servers.append(FrameServer("127.0.0.1", 0, export, timeout_s=5).start())
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def pull(port: int, request_id: str = "req-1", expect: FrameHeader = EXPECT, timeout_s: float = 5.0) -> KVFrame:
    return pull_frame("127.0.0.1", port, {"request_id": request_id, "block_ids": [7, 3, 9]}, expect,
                      torch.float32, timeout_s)


@pytest.mark.parametrize("sealed", [False, True])
@pytest.mark.parametrize("chunk", [64, 1000, 1 << 19])
def test_side_channel_round_trip_is_bit_exact(frame_server, monkeypatch, chunk: int, sealed: bool) -> None:
    monkeypatch.setattr("engine.reference.kv_wire.CHUNK", chunk)  # many chunks, ragged last chunk, one chunk
    kv = blocks(3, seed=5)
    frame = pull(frame_server(serving(kv, sealed=sealed)).port)
    assert frame.request_id == "req-1" and frame.block_indices == [0, 1, 2] and torch.equal(frame.kv, kv)
    bf16 = blocks(3, torch.bfloat16)
    header = FrameHeader.for_blocks("req-1", [0, 1, 2], torch.bfloat16, BLOCK_SHAPE)
    got = pull_frame("127.0.0.1", frame_server(serving(bf16, header)).port, {"request_id": "req-1", "block_ids": []},
                     header, torch.bfloat16, 5.0)
    assert torch.equal(got.kv, bf16)


@pytest.mark.parametrize("sealed", [False, True])
def test_side_channel_sends_the_http_frame_bytes(frame_server, sealed: bool) -> None:
    """The same frame on both transports: what the side channel sends is encode_frame's output."""
    kv = blocks(3, seed=6)
    port = frame_server(serving(kv, sealed=sealed)).port
    with socket.create_connection(("127.0.0.1", port)) as sock:
        raw = json.dumps({"version": 2, "request_id": "req-1", "block_ids": [1, 2, 3]}).encode()
        sock.sendall(struct.pack("!I", len(raw)) + raw)
        received = b"".join(iter(lambda: sock.recv(1 << 16), b""))
    assert received == bytes(encode_frame("req-1", [0, 1, 2], kv))


def test_side_channel_refusals_are_clear(frame_server) -> None:
    port = frame_server(serving(blocks(3))).port
    with pytest.raises(KVPullRefused) as err:
        pull(port, request_id="someone-else")
    assert err.value.reason == "status" and "no K/V held" in str(err.value)
    with socket.create_connection(("127.0.0.1", port)) as sock:  # a request that is not JSON
        sock.sendall(struct.pack("!I", 5) + b"hello")
        reply = b"".join(iter(lambda: sock.recv(1 << 16), b""))
    assert b'"error"' in reply and b"not JSON" in reply


def test_side_channel_refuses_a_frame_for_other_blocks_before_its_payload(frame_server) -> None:
    other = FrameHeader.for_blocks("req-1", [0, 1, 5], torch.float32, BLOCK_SHAPE)
    with pytest.raises(KVFrameError) as err:
        pull(frame_server(serving(blocks(3), other)).port)
    assert err.value.reason == "indices"
    bf16 = FrameHeader.for_blocks("req-1", [0, 1, 2], torch.bfloat16, BLOCK_SHAPE)
    with pytest.raises(KVFrameError) as err:
        pull(frame_server(serving(blocks(3, torch.bfloat16), bf16)).port)
    assert err.value.reason == "dtype"


@pytest.fixture
def raw_peer() -> Iterator[Callable[[Callable[[socket.socket], None]], int]]:
    """A side-channel peer that reads one request and then does whatever the test says."""
    listeners: list[tuple[socket.socket, threading.Thread]] = []

    def start(reply: Callable[[socket.socket], None]) -> int:
        listener = socket.create_server(("127.0.0.1", 0))

        def run() -> None:
            conn, _ = listener.accept()
            with conn:
                length = struct.unpack("!I", conn.recv(4, socket.MSG_WAITALL))[0]
                conn.recv(length, socket.MSG_WAITALL)
                reply(conn)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        listeners.append((listener, thread))
        return listener.getsockname()[1]

    yield start
    for listener, thread in listeners:
        thread.join(timeout=5)
        listener.close()


GENUINE = bytes(encode_frame("req-1", [0, 1, 2], blocks(3, seed=9)))
SIDE_DAMAGE = {
    "flipped_payload_byte": (lambda f: f[:-50] + bytes([f[-50] ^ 1]) + f[-49:], "checksum"),
    "flipped_checksum_byte": (lambda f: f[:-1] + bytes([f[-1] ^ 1]), "checksum"),
    "closed_mid_payload": (lambda f: f[: len(f) - 100], "truncated"),
    "closed_before_checksum": (lambda f: f[:-4], "truncated"),
    "garbage_header": (lambda f: b"\x00\x00\x00\x10this is not json", "header"),
    "nothing": (lambda f: b"", "truncated"),
}


@pytest.mark.parametrize("damage", list(SIDE_DAMAGE))
def test_side_channel_damage_is_caught(raw_peer, damage: str) -> None:
    damage_fn, reason = SIDE_DAMAGE[damage]
    with pytest.raises(KVFrameError) as err:
        pull(raw_peer(lambda conn: conn.sendall(damage_fn(GENUINE))))
    assert err.value.reason == reason
    assert torch.equal(pull(raw_peer(lambda conn: conn.sendall(GENUINE))).kv, blocks(3, seed=9))  # control


def test_side_channel_timeout_and_refused_connection(raw_peer, free_port) -> None:
    sent_part, released, hung_up = threading.Event(), threading.Event(), threading.Event()

    def stall(conn: socket.socket) -> None:  # a peer that sends part of a frame and then goes quiet
        conn.sendall(GENUINE[:1000])
        sent_part.set()
        released.wait(timeout=30)
        hung_up.set()

    try:
        with pytest.raises(KVFrameError) as err:
            pull(raw_peer(stall), timeout_s=0.3)
        # The pull gave up on its own while the peer still held the connection open, not when it hung up.
        assert err.value.reason == "timeout"
        assert sent_part.is_set() and not hung_up.is_set()
    finally:
        released.set()
    with pytest.raises(ConnectionRefusedError):  # not a KVFrameError: the caller falls back to HTTP
        pull(free_port())


# --- frame buffers --------------------------------------------------------------------------------------


def test_buffer_pool_reuses_buffers_only_once_nothing_views_them() -> None:
    pool = BufferPool(max_bytes=64 << 20)
    small, big = pool.take(3 << 20), pool.take(10 << 20)
    small_base, big_base = small.base, big.base
    assert len(small) == 3 << 20 and len(big) == 10 << 20 and pool.free_bytes == 0
    tensor = torch.from_numpy(big).view(torch.float32)[:10]  # something still views the big buffer
    del small, big
    gc.collect()
    assert pool.free_bytes == small_base.nbytes  # only the small one is back
    again = pool.take(3 << 20)
    assert again.base is small_base and pool.free_bytes == 0
    assert pool.take(1 << 20).base is not small_base  # far too small for any pooled buffer: a new one
    del tensor
    gc.collect()
    taken = pool.take(9 << 20)
    assert taken.base is big_base  # the smallest pooled buffer that fits, once free
    assert pool.take(9 << 20).base is not big_base  # in use


def test_buffer_pool_keeps_at_most_max_bytes() -> None:
    pool = BufferPool(max_bytes=5 << 20)
    buffers = [pool.take(4 << 20) for _ in range(3)]
    del buffers
    gc.collect()
    assert 0 < pool.free_bytes <= 5 << 20


BIG_SHAPE = (2, 2, 16, 4, 64)  # 32 KiB blocks: 100 of them are past ChunkChecksum's threaded threshold


def test_side_channel_large_frames_round_trip_and_catch_damage(frame_server, raw_peer) -> None:
    kv = torch.randn(2, 2, 100, 16, 4, 64, generator=torch.Generator().manual_seed(3))
    expect = FrameHeader.for_blocks("big", list(range(100)), torch.float32, BIG_SHAPE)
    assert expect.nbytes >= 3 << 20

    def big_pull(port: int) -> KVFrame:
        return pull_frame("127.0.0.1", port, {"request_id": "big", "block_ids": []}, expect, torch.float32, 10.0)

    for sealed in (False, True):
        assert torch.equal(big_pull(frame_server(serving(kv, expect, sealed=sealed)).port).kv, kv)
    genuine = bytes(encode_frame("big", list(range(100)), kv))
    for offset in (len(genuine) - expect.nbytes - 4, len(genuine) // 2, len(genuine) - 5):  # first, middle, last
        damaged = genuine[:offset] + bytes([genuine[offset] ^ 0x10]) + genuine[offset + 1:]
        with pytest.raises(KVFrameError) as err:
            big_pull(raw_peer(lambda conn, data=damaged: conn.sendall(data)))
        assert err.value.reason == "checksum"
    with pytest.raises(KVFrameError) as err:
        big_pull(raw_peer(lambda conn: conn.sendall(genuine[: len(genuine) // 2])))
    assert err.value.reason == "truncated"


def test_a_frame_still_being_sealed_is_sent_and_its_checksum_follows(frame_server) -> None:
    kv = blocks(3, seed=8)
    frame = FrameBuffer(EXPECT, torch.float32)
    frame.payload.copy_(kv)
    threading.Timer(0.3, frame.seal).start()  # the payload goes out first; the checksum when it is ready
    got = pull(frame_server(lambda request: frame).port)
    assert torch.equal(got.kv, kv)


# --- the engine core's export into a frame buffer --------------------------------------------------------


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_pull_held_exports_into_a_buffer_and_keeps_or_releases_the_hold(kv_dtype: str) -> None:
    engine = LLMEngine(EngineConfig(model="tiny", kv_cache_mib=8, kv_cache_dtype=kv_dtype))
    engine.add_request("r", list(range(100, 200)), SamplingParams(max_tokens=1, temperature=0.0), hold_blocks=True)
    while engine.has_work():
        engine.step()
    table = engine._held["r"].seq.block_table
    ids = [table[5], table[0], table[1], table[2], table[6]]  # runs of consecutive ids, and not
    out = empty_kv(engine.runner.kv_dtype, (*engine.runner.kv.shape[:2], len(ids), *engine.runner.kv.shape[3:]))
    engine.pull_held("r", ids, out=out, release=False)
    assert torch.equal(out, engine.runner.export_kv(ids)) and "r" in engine._held  # still held
    with pytest.raises(ValueError):
        engine.pull_held("r", ids[:2], out=out)  # a buffer of the wrong shape: refused, nothing released
    assert torch.equal(engine.pull_held("r", ids[:2]), engine.runner.export_kv(ids[:2]))
    assert "r" not in engine._held and engine.block_manager.usage == 0.0


# --- advertising the side channel ---------------------------------------------------------------------------


class StubEngine:
    num_blocks = 8
    kv_dtype = torch.float32
    kv_block_shape = BLOCK_SHAPE


@pytest.mark.parametrize("side_channel", [("127.0.0.1", 0), None])
def test_prefill_params_name_the_side_channel_only_when_it_listens(side_channel) -> None:
    async def scenario() -> dict:
        transfer = KVTransfer(StubEngine(), None, block_size=BS, timeout_s=5, failure_policy="recompute",
                              side_channel=side_channel)
        await transfer.start()
        try:
            params = {"remote_request_id": "r", "remote_block_ids": [3, 4], "remote_port": 8100}
            advertised = transfer.finished_prefill(params, list(range(6)), prepare=False)
            if side_channel is not None:
                with socket.create_connection(("127.0.0.1", advertised["remote_kv_port"])):
                    pass  # it listens there
            return advertised
        finally:
            await transfer.aclose()

    advertised = asyncio.run(scenario())
    assert advertised["prompt_hash"] == prompt_hash(list(range(6)))
    assert ("remote_kv_port" in advertised) == (side_channel is not None)


def test_a_buffer_given_back_while_the_pool_is_locked_does_not_deadlock() -> None:
    """The garbage collector runs a view's finalizer at any allocation, also one made inside the pool's own
    locked section (take -> _reuse): giving a buffer back there must not wait for that lock."""
    pool = BufferPool(max_bytes=8 << 20)
    finished = threading.Event()

    def give_back_inside_the_lock() -> None:
        with pool._lock:  # as when the collector runs a finalizer during _reuse
            pool._give_back(np.empty(2 << 20, dtype=np.uint8))
        finished.set()

    worker = threading.Thread(target=give_back_inside_the_lock, daemon=True)
    worker.start()
    assert finished.wait(5), "giving a buffer back under the pool's lock deadlocked"
    assert pool.free_bytes == 2 << 20
    assert pool.take(2 << 20).nbytes == 2 << 20 and pool.free_bytes == 0  # and it is reused
