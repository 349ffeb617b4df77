"""KVEventPublisher on loopback, fed synthetic steps: vLLM's frames, sequence numbers, replay, the bounded buffer."""

from __future__ import annotations

import time
from collections.abc import Iterator

import msgpack
import pytest
import zmq

from engine.kv_events import END_SEQ, AllBlocksCleared, BlockRemoved, BlockStored, decode_batch
from engine.reference.kv_event_publisher import KVEventPublisher
from engine.contract.outputs import StepResult

TOPIC = "kv-test"


@pytest.fixture
def publisher(free_port) -> Iterator[KVEventPublisher]:
    pub = KVEventPublisher(f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}", TOPIC, buffer_size=3)
    pub.start()
    yield pub
    pub.shutdown()


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def subscriber(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.connect(endpoint)
    return sub


def wait_connected(sub: zmq.Socket, publisher: KVEventPublisher) -> list:
    """Publish probe steps until the subscriber hears one (ZMQ's slow joiner); the frames it heard."""
    sub.setsockopt(zmq.RCVTIMEO, 100)
    for _ in range(50):
        publisher.on_step(StepResult(kv_events=[AllBlocksCleared()]))
        try:
            frames = [sub.recv_multipart()]
        except zmq.Again:
            continue
        sub.setsockopt(zmq.RCVTIMEO, 5000)
        return frames
    raise AssertionError("subscriber never connected")


def replay(ctx: zmq.Context, endpoint: str, start: int) -> list[tuple[int, bytes]]:
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.connect(endpoint)
    dealer.send_multipart((b"", start.to_bytes(8, "big")))
    batches = []
    while True:
        empty, seq, payload = dealer.recv_multipart()
        assert empty == b""
        if seq == END_SEQ:
            assert payload == b""
            dealer.close(linger=0)
            return batches
        batches.append((int.from_bytes(seq, "big"), payload))


def stored(*hashes: int) -> BlockStored:
    tokens = list(range(16 * len(hashes)))
    return BlockStored(block_hashes=list(hashes), parent_block_hash=None, token_ids=tokens, block_size=16)


def test_frames_are_topic_seq_and_a_map_form_batch(publisher: KVEventPublisher, ctx: zmq.Context) -> None:
    sub = subscriber(ctx, publisher.endpoint)
    probes = wait_connected(sub, publisher)
    publisher.on_step(StepResult(kv_events=[stored(11, 12), BlockRemoved(block_hashes=[5])]))
    topic, seq, payload = sub.recv_multipart()
    assert topic == TOPIC.encode()
    assert int.from_bytes(seq, "big") == int.from_bytes(probes[-1][1], "big") + 1
    raw = msgpack.unpackb(payload)
    assert isinstance(raw, list) and len(raw) == 3 and raw[2] == 0  # [ts, events, dp_rank]
    assert raw[1][0]["type"] == "BlockStored" and raw[1][0]["block_hashes"] == [11, 12]
    batch = decode_batch(payload)
    assert [type(e).__name__ for e in batch.events] == ["BlockStored", "BlockRemoved"]


def test_sequence_numbers_start_at_zero_and_steps_without_events_send_nothing(publisher: KVEventPublisher,
                                                                              ctx: zmq.Context) -> None:
    sub = subscriber(ctx, publisher.endpoint)
    probes = wait_connected(sub, publisher)
    publisher.on_step(StepResult(kv_events=[]))
    publisher.on_step(StepResult(kv_events=[stored(1)]))
    _, seq, _ = sub.recv_multipart()
    first_probe = int.from_bytes(probes[0][1], "big")
    assert int.from_bytes(seq, "big") == first_probe + 1
    # Every seq the publisher used is in 0..published-1, so the first batch of a fresh publisher was 0.
    assert publisher.published == int.from_bytes(seq, "big") + 1
    assert [s for s, _ in replay(ctx, publisher.replay_endpoint, 0)][-1] == publisher.published - 1


def test_replay_returns_buffered_batches_from_the_start_seq(free_port, ctx: zmq.Context) -> None:
    pub = KVEventPublisher(f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}", TOPIC, buffer_size=10)
    pub.start()
    try:
        for h in range(5):
            pub.on_step(StepResult(kv_events=[stored(100 + h)]))
        batches = _replay_when_published(ctx, pub, 0, published=5)
        assert [seq for seq, _ in batches] == [0, 1, 2, 3, 4]
        assert [decode_batch(p).events[0].block_hashes for _, p in batches] == [[100], [101], [102], [103], [104]]
        assert [seq for seq, _ in replay(ctx, pub.replay_endpoint, 3)] == [3, 4]
        assert replay(ctx, pub.replay_endpoint, 9) == []
    finally:
        pub.shutdown()


def test_replay_buffer_keeps_only_the_newest_batches(publisher: KVEventPublisher, ctx: zmq.Context) -> None:
    for h in range(5):
        publisher.on_step(StepResult(kv_events=[stored(h)]))
    batches = _replay_when_published(ctx, publisher, 0, published=5)
    assert [seq for seq, _ in batches] == [2, 3, 4]


def test_binding_a_taken_endpoint_fails_at_start(publisher: KVEventPublisher) -> None:
    clash = KVEventPublisher(publisher.endpoint)
    with pytest.raises(zmq.ZMQError):
        clash.start()


def _replay_when_published(ctx: zmq.Context, pub: KVEventPublisher, start: int, published: int) -> list:
    """Replay once the publisher thread has sent `published` batches (it publishes asynchronously)."""
    for _ in range(500):
        if pub.published >= published:
            return replay(ctx, pub.replay_endpoint, start)
        time.sleep(0.01)
    raise AssertionError(f"only {pub.published} batches published")
