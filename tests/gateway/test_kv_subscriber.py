"""KVEventSubscriber against a real ZMQ publisher + replay ROUTER on loopback, in vLLM's wire format."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgpack
import pytest
import zmq
import zmq.asyncio

from agent.ports import free_port
from engine.hashing import block_hashes_int64
from engine.kv_events import END_SEQ, AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEvent, encode_batch
from fleetctl.gateway.kv_subscriber import (
    KVEventsEndpoint,
    KVEventSubscriber,
    KVSubscriberPool,
    SeqAction,
    classify_live,
    request_replay,
)
from fleetctl.gateway.prefix_index import PrefixIndex

TOPIC = b"kv-events"
HASHES = block_hashes_int64(list(range(16 * 8)))  # eight blocks


def array_payload(events: list[KVEvent]) -> bytes:
    """The positional-array event form vLLM sent before PR #42892."""
    raw = []
    for e in events:
        if isinstance(e, BlockStored):
            raw.append(["BlockStored", e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size, None, e.medium])
        elif isinstance(e, BlockRemoved):
            raw.append(["BlockRemoved", e.block_hashes, e.medium])
        else:
            raw.append(["AllBlocksCleared"])
    return msgpack.packb([time.time(), raw, 0])


def stored(hashes: list[int]) -> BlockStored:
    return BlockStored(block_hashes=list(hashes), parent_block_hash=None, token_ids=[], block_size=16)


class EnginePublisher:
    """A stand-in for an engine's KV event publisher: XPUB (wire-compatible with vLLM's PUB, and it tells us
    when a subscription arrived) plus a replay ROUTER that serves its buffer, as vLLM's ZmqEventPublisher."""

    def __init__(self, ctx: zmq.asyncio.Context):
        self.ctx = ctx
        self.buffer: list[tuple[int, bytes]] = []
        self.next_seq = 0
        self.pub_port = self.replay_port = 0
        self.pub: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task | None = None
        self._router: zmq.asyncio.Socket | None = None

    @property
    def endpoint(self) -> tuple[str, str]:
        return f"tcp://127.0.0.1:{self.pub_port}", f"tcp://127.0.0.1:{self.replay_port}"

    async def start(self) -> None:
        self.pub = self.ctx.socket(zmq.XPUB)
        self._router = self.ctx.socket(zmq.ROUTER)
        for sock in (self.pub, self._router):
            sock.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # report every subscription, not only a topic's first
        self.pub_port = await bind(self.pub, self.pub_port)
        self.replay_port = await bind(self._router, self.replay_port)
        self._replay_task = asyncio.create_task(self._serve_replay())

    async def stop(self) -> None:
        """Go away (a network drop or a restart): close both sockets, keep the buffer."""
        self._replay_task.cancel()
        await asyncio.gather(self._replay_task, return_exceptions=True)
        self.pub.close(linger=0)
        self._router.close(linger=0)
        self.pub = None

    async def wait_subscribed(self, timeout_s: float = 10.0) -> None:
        """Until a subscriber's subscription arrives (so the next live batch reaches it)."""
        while (await asyncio.wait_for(self.pub.recv(), timeout_s))[:1] != b"\x01":
            pass  # an unsubscription from a subscriber that left

    async def publish(self, events: list[KVEvent], encoding: str = "map", live: bool = True) -> int:
        payload = encode_batch(EventBatch(time.time(), events, 0)) if encoding == "map" else array_payload(events)
        return await self.publish_raw(payload, live)

    async def publish_raw(self, payload: bytes, live: bool = True) -> int:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        self.buffer.append((seq, payload))
        if live and self.pub is not None:
            await self.pub.send_multipart([TOPIC, seq.to_bytes(8, "big"), payload])
        return seq

    async def _serve_replay(self) -> None:
        while True:
            client_id, _, start = await self._router.recv_multipart()
            for seq, payload in self.buffer:
                if seq >= int.from_bytes(start, "big"):
                    await self._router.send_multipart([client_id, b"", seq.to_bytes(8, "big"), payload])
            await self._router.send_multipart([client_id, b"", END_SEQ, b""])


async def bind(sock: zmq.asyncio.Socket, port: int) -> int:
    if not port:
        return sock.bind_to_random_port("tcp://127.0.0.1")
    for _ in range(100):  # rebinding the same port: the old listener may take a moment to go
        try:
            sock.bind(f"tcp://127.0.0.1:{port}")
            return port
        except zmq.ZMQError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"port {port} stayed busy")


async def eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait for a condition; the deadline only bounds a hang, it is not a speed assertion."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.fixture
async def ctx():
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
async def publisher(ctx):
    pub = EnginePublisher(ctx)
    await pub.start()
    yield pub
    if pub.pub is not None:
        await pub.stop()


def subscriber_for(publisher: EnginePublisher, index: PrefixIndex, ctx, engine_id: str = "e0") -> KVEventSubscriber:
    pub_endpoint, replay_endpoint = publisher.endpoint
    return KVEventSubscriber(KVEventsEndpoint(engine_id, pub_endpoint, replay_endpoint, TOPIC.decode()), index, ctx)


async def test_live_batches_in_both_encodings_reach_the_index(ctx, publisher):
    index = PrefixIndex()
    sub = subscriber_for(publisher, index, ctx)
    sub.start()
    await publisher.wait_subscribed()
    await publisher.publish([stored(HASHES[:2])], encoding="map")
    await publisher.publish([stored(HASHES[2:4])], encoding="array")
    await eventually(lambda: index.longest_prefix(HASHES) == {"e0": 4})
    await publisher.publish([BlockRemoved(block_hashes=[HASHES[1]])], encoding="array")
    await eventually(lambda: index.longest_prefix(HASHES) == {"e0": 1})
    await sub.stop()
    assert index.last_seq("e0") == 2 and sub.stats.decode_errors == 0


async def test_reconnecting_subscriber_replays_what_it_missed(ctx, publisher):
    index = PrefixIndex()
    first = subscriber_for(publisher, index, ctx)
    first.start()
    await publisher.wait_subscribed()
    await publisher.publish([stored(HASHES[:2])])
    await eventually(lambda: index.last_seq("e0") == 0)
    await first.stop()  # the gateway's subscriber goes away...

    await publisher.publish([stored(HASHES[2:5])], encoding="map")  # ...while the engine keeps publishing
    await publisher.publish([stored(HASHES[5:8])], encoding="array")

    second = subscriber_for(publisher, index, ctx)
    second.start()
    await eventually(lambda: index.longest_prefix(HASHES) == {"e0": 8})
    assert second.stats.replayed_batches == 2 and index.last_seq("e0") == 2

    await publisher.wait_subscribed()
    await publisher.publish([stored([42])])  # and live batches flow again afterwards
    await eventually(lambda: index.holds("e0", 42))
    await second.stop()


async def test_a_gap_in_the_live_stream_is_filled_from_replay(ctx, publisher):
    index = PrefixIndex()
    sub = subscriber_for(publisher, index, ctx)
    sub.start()
    await publisher.wait_subscribed()
    await eventually(lambda: sub.stats.connects == 1 and sub.stats.replays == 1)
    await publisher.publish([stored(HASHES[:1])])
    await publisher.publish([stored(HASHES[1:3])], live=False)  # lost on the way (e.g. a full HWM)
    await publisher.publish([stored(HASHES[3:4])])
    await eventually(lambda: index.longest_prefix(HASHES) == {"e0": 4})
    assert sub.stats.replays == 2 and index.stats.gaps_accepted == 0
    await sub.stop()


async def test_publisher_drop_triggers_replay_on_reconnect(ctx, publisher):
    index = PrefixIndex()
    sub = subscriber_for(publisher, index, ctx)
    sub.start()
    await publisher.wait_subscribed()
    await publisher.publish([stored(HASHES[:2])])
    await eventually(lambda: index.last_seq("e0") == 0)

    await publisher.stop()  # the link drops; batches published meanwhile reach only the replay buffer
    await publisher.publish([stored(HASHES[2:4])], live=False)
    await publisher.publish([AllBlocksCleared(), stored(HASHES[:1])], live=False)
    await publisher.start()  # same ports: ZMQ reconnects by itself

    await eventually(lambda: index.last_seq("e0") == 2)
    assert index.longest_prefix(HASHES) == {"e0": 1} and sub.stats.connects >= 2
    await sub.stop()


async def test_a_restarted_publisher_resets_the_engines_entries(ctx, publisher):
    index = PrefixIndex()
    sub = subscriber_for(publisher, index, ctx)
    sub.start()
    await publisher.wait_subscribed()
    for i in range(3):
        await publisher.publish([stored(HASHES[i : i + 1])])
    await eventually(lambda: index.last_seq("e0") == 2)

    await publisher.stop()
    publisher.buffer, publisher.next_seq = [], 0  # the engine restarted: empty cache, numbering from 0
    await publisher.start()
    await publisher.wait_subscribed()
    await publisher.publish([stored([7])])

    await eventually(lambda: index.holds("e0", 7))
    assert index.longest_prefix(HASHES) == {"e0": 0} and index.last_seq("e0") == 0
    assert sub.stats.restarts == 1
    await sub.stop()


async def test_an_undecodable_batch_advances_the_sequence(ctx, publisher):
    index = PrefixIndex()
    sub = subscriber_for(publisher, index, ctx)
    sub.start()
    await publisher.wait_subscribed()
    await eventually(lambda: sub.stats.replays == 1)
    await publisher.publish_raw(b"\xc1 not msgpack")
    await publisher.publish([stored(HASHES[:1])])
    await eventually(lambda: index.last_seq("e0") == 1)
    assert sub.stats.decode_errors == 1 and index.longest_prefix(HASHES) == {"e0": 1}
    assert index.stats.gaps_detected == 0
    await sub.stop()


async def test_pool_follows_the_set_of_engines_and_clears_only_the_one_that_left(ctx):
    pubs = [EnginePublisher(ctx), EnginePublisher(ctx)]
    for p in pubs:
        await p.start()
    index = PrefixIndex()
    pool = KVSubscriberPool(index, ctx)
    endpoints = [KVEventsEndpoint(f"e{i}", *p.endpoint, topic=TOPIC.decode()) for i, p in enumerate(pubs)]
    await pool.sync(endpoints)
    for p in pubs:
        await p.wait_subscribed()
        await p.publish([stored(HASHES[:3])])
    await eventually(lambda: index.longest_prefix(HASHES) == {"e0": 3, "e1": 3})
    await pubs[0].publish([AllBlocksCleared()])
    await eventually(lambda: index.longest_prefix(HASHES) == {"e0": 0, "e1": 3})

    await pool.sync(endpoints[1:])  # e0 left the routing table
    assert index.engines() == ["e1"] and list(pool.subscribers) == ["e1"]
    await pool.close()
    for p in pubs:
        await p.stop()


async def test_request_replay_returns_buffered_batches_from_start(ctx, publisher):
    for i in range(4):
        await publisher.publish([stored([i])], live=False)
    batches = await request_replay(ctx, publisher.endpoint[1], 2)
    assert [seq for seq, _ in batches] == [2, 3]


def test_classify_live_sequence_numbers():
    assert classify_live(5, 4, 4, synced=True) is SeqAction.APPLY
    assert classify_live(0, None, None, synced=True) is SeqAction.APPLY
    assert classify_live(7, 4, 4, synced=True) is SeqAction.REPLAY
    assert classify_live(5, 4, 4, synced=False) is SeqAction.REPLAY
    assert classify_live(3, 6, 2, synced=True) is SeqAction.SKIP  # replay already applied it
    assert classify_live(3, 6, None, synced=True) is SeqAction.SKIP
    assert classify_live(0, 6, 6, synced=True) is SeqAction.RESTART  # the live numbering went back


async def test_subscriber_reads_the_reference_engines_publisher(ctx):
    """The contract check: the engine's own publisher (engine/reference/kv_event_publisher.py) and this
    subscriber agree on frames, sequence numbers and replay."""
    publisher_module = pytest.importorskip("engine.reference.kv_event_publisher")
    from engine.contract.outputs import StepResult

    pub_endpoint, replay_endpoint = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    engine_publisher = publisher_module.KVEventPublisher(pub_endpoint, replay_endpoint, topic="kv-events")
    engine_publisher.start()
    index = PrefixIndex()
    endpoint = KVEventsEndpoint("ref", pub_endpoint, replay_endpoint, "kv-events")
    try:
        engine_publisher.on_step(StepResult(kv_events=[stored(HASHES[:3])]))  # before anyone listens
        first = KVEventSubscriber(endpoint, index, ctx)
        first.start()
        await eventually(lambda: index.longest_prefix(HASHES) == {"ref": 3})  # via replay on connect
        await first.stop()

        engine_publisher.on_step(StepResult(kv_events=[BlockRemoved(block_hashes=[HASHES[2]])]))
        second = KVEventSubscriber(endpoint, index, ctx)
        second.start()
        await eventually(lambda: index.longest_prefix(HASHES) == {"ref": 2})  # missed while away: replayed

        for marker in range(1000, 1200):  # live batches; one lost before the subscription took is replayed
            engine_publisher.on_step(StepResult(kv_events=[stored([marker])]))
            await asyncio.sleep(0.05)
            if index.holds("ref", 1000):
                break
        await eventually(lambda: index.last_seq("ref") == engine_publisher.published - 1)
        assert all(index.holds("ref", m) for m in range(1000, marker + 1))
        await second.stop()
    finally:
        engine_publisher.shutdown()
