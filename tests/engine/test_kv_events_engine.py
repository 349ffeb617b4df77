"""KV events from a real engine process, read by a msgpack ZMQ subscriber: the stored blocks' hashes are the
contract's `block_hashes_int64` of the prompt, and the replay socket returns the batches published earlier."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import msgpack
import pytest
import zmq

from engine.hashing import block_hashes_int64
from engine.kv_events import END_SEQ, AllBlocksCleared, BlockStored, decode_batch

if TYPE_CHECKING:
    from conftest import EngineProcess

HASH_SEED = "7"
TOPIC = "kv-engine-test"
BLOCK = 16


@pytest.fixture(scope="module")
def engine(launch_engine, free_port) -> EngineProcess:
    return launch_engine(
        "--kv-events-endpoint", f"tcp://127.0.0.1:{free_port()}",
        "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{free_port()}",
        "--kv-events-topic", TOPIC, "--hash-seed", HASH_SEED,
    )


@pytest.fixture(scope="module")
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def endpoint(engine: EngineProcess, flag: str) -> str:
    return engine.flags[engine.flags.index(flag) + 1]


@pytest.fixture(scope="module")
def subscription(engine: EngineProcess, ctx: zmq.Context) -> zmq.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    sub.setsockopt(zmq.RCVTIMEO, 200)
    sub.connect(endpoint(engine, "--kv-events-endpoint"))
    # ZMQ's slow joiner: a reset of the (empty) prefix cache publishes AllBlocksCleared; repeat until one arrives.
    for _ in range(50):
        assert engine.post("/reset_prefix_cache").json() == {"reset": True}
        try:
            sub.recv_multipart()
            break
        except zmq.Again:
            continue
    else:
        raise AssertionError("the subscriber never received an event")
    drain(sub)
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    return sub


def drain(sub: zmq.Socket) -> None:
    timeout = sub.getsockopt(zmq.RCVTIMEO)
    sub.setsockopt(zmq.RCVTIMEO, 300)
    try:
        while True:
            sub.recv_multipart()
    except zmq.Again:
        pass
    sub.setsockopt(zmq.RCVTIMEO, timeout)


def receive_stored(sub: zmq.Socket, count: int) -> tuple[list[BlockStored], list[tuple[int, bytes]]]:
    """BlockStored events until `count` block hashes arrived, and the raw (seq, payload) frames they came in."""
    events: list[BlockStored] = []
    frames = []
    while sum(len(e.block_hashes) for e in events) < count:
        topic, seq, payload = sub.recv_multipart()
        assert topic == TOPIC.encode()
        frames.append((int.from_bytes(seq, "big"), payload))
        events += [e for e in decode_batch(payload).events if isinstance(e, BlockStored)]
    return events, frames


def generate(engine: EngineProcess, prompt: list[int]) -> None:
    response = engine.post("/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0})
    assert response.status_code == 200, response.text


def test_stored_blocks_carry_the_contract_hashes(engine: EngineProcess, subscription: zmq.Socket) -> None:
    prompt = list(range(500, 540))  # 2 full blocks and 8 tokens
    generate(engine, prompt)
    events, _ = receive_stored(subscription, 2)
    hashes = [h for e in events for h in e.block_hashes]
    assert hashes == block_hashes_int64(prompt, BLOCK, HASH_SEED)
    assert events[0].parent_block_hash is None
    assert [t for e in events for t in e.token_ids] == prompt[: 2 * BLOCK]
    assert all(e.block_size == BLOCK and e.medium == "GPU" for e in events)


def test_a_shared_prefix_stores_only_the_new_blocks(engine: EngineProcess, subscription: zmq.Socket) -> None:
    first = list(range(700, 732))
    generate(engine, first)
    receive_stored(subscription, 2)
    second = first[:BLOCK] + list(range(900, 916)) + [1, 2, 3]  # block 0 shared, block 1 new
    generate(engine, second)
    events, _ = receive_stored(subscription, 1)
    expected = block_hashes_int64(second, BLOCK, HASH_SEED)
    assert [h for e in events for h in e.block_hashes] == [expected[1]]
    assert events[0].parent_block_hash == expected[0]


def test_events_are_map_form_msgpack(engine: EngineProcess, subscription: zmq.Socket) -> None:
    generate(engine, list(range(1100, 1117)))
    _, frames = receive_stored(subscription, 1)
    ts, events, dp_rank = msgpack.unpackb(frames[0][1])
    assert isinstance(ts, float) and dp_rank == 0
    assert events[0]["type"] == "BlockStored" and "block_hashes" in events[0]


def test_replay_returns_the_batches_published_earlier(engine: EngineProcess, subscription: zmq.Socket,
                                                       ctx: zmq.Context) -> None:
    generate(engine, list(range(1300, 1348)))
    _, live = receive_stored(subscription, 3)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.connect(endpoint(engine, "--kv-events-replay-endpoint"))
    dealer.send_multipart((b"", (0).to_bytes(8, "big")))
    replayed = {}
    while True:
        _, seq, payload = dealer.recv_multipart()
        if seq == END_SEQ:
            break
        replayed[int.from_bytes(seq, "big")] = payload
    dealer.close(linger=0)
    assert sorted(replayed) == list(range(len(replayed)))  # every batch since seq 0, in order
    for seq, payload in live:
        assert replayed[seq] == payload


def test_reset_prefix_cache_publishes_all_blocks_cleared(engine: EngineProcess, subscription: zmq.Socket) -> None:
    drain(subscription)
    assert engine.post("/reset_prefix_cache").json() == {"reset": True}
    _, _, payload = subscription.recv_multipart()
    assert any(isinstance(e, AllBlocksCleared) for e in decode_batch(payload).events)
