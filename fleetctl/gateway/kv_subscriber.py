"""Subscribe to engines' KV events (vLLM's ZMQ wire form) and keep the prefix index current.

One asyncio task per engine endpoint:
- a SUB socket on the engine's publisher receives frames [topic, 8-byte big-endian seq, msgpack batch];
  `engine.kv_events.decode_batch` decodes both the map and the older positional-array event forms;
- a socket monitor reports every TCP (re)connect; on each, and whenever a live batch's sequence number
  skips ahead, the subscriber asks the engine's replay socket (ROUTER) for every batch from the index's
  next expected sequence number on. Request: [b"", 8-byte start seq] from a DEALER; reply: frames
  ([b""], seq, payload) per buffered batch, then END_SEQ with an empty payload.

Sequence handling is the pure `classify_live`: apply the next batch; replay on a gap; skip a batch a
replay already applied (the overlap between replay and live stream). PUB/SUB never reorders or repeats,
so a live number at or below the previous LIVE number means the publisher restarted (vLLM numbers from 0
each start): the engine's entries are reset and replayed from 0. A publisher that restarted while no
live batch reached us and has already passed our last number looks like a continuation; the routing
table's engine state (`starting` after a restart) is what drops such an engine from the index.

A batch that does not decode is applied as an empty batch so the sequence still advances; a gap the
replay cannot fill (buffer rolled over, or no replay endpoint) is accepted and counted.

Every batch applied is also shown to `hash_checks` (hash_check.HashChecks), which compares the engine's
hashes of first blocks with the gateway's own: an engine started with another seed is flagged, not silently
never hit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from engine.kv_events import END_SEQ, EventBatch, decode_batch
from fleetctl.gateway.hash_check import HashChecks
from fleetctl.gateway.prefix_index import EngineId, PrefixIndex, SeqCheck

log = logging.getLogger(__name__)

DEFAULT_REPLAY_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class KVEventsEndpoint:
    """Where one engine publishes its KV events."""

    engine_id: EngineId
    publisher: str  # the engine's PUB endpoint, e.g. tcp://10.0.0.5:5557
    replay: str | None = None  # its replay ROUTER endpoint; None: gaps cannot be filled
    topic: str = ""  # vLLM's KVEventsConfig.topic; "" receives every topic


@dataclass
class SubscriberStats:
    connects: int = 0
    replays: int = 0
    replayed_batches: int = 0
    replay_failures: int = 0
    restarts: int = 0
    decode_errors: int = 0


class SeqAction(Enum):
    APPLY = "apply"
    SKIP = "skip"  # a replay already applied it (overlap between replay and live stream)
    REPLAY = "replay"  # a gap, or not yet synced since the last (re)connect
    RESTART = "restart"  # the live numbering went back: the publisher restarted


def classify_live(seq: int, last_applied: int | None, last_live: int | None, synced: bool) -> SeqAction:
    """What to do with a live batch numbered `seq`.

    `last_applied`: the index's last applied number for the engine (live or replayed); `last_live`: the
    number of the previous live batch this subscriber received; `synced`: a replay was attempted since
    the last (re)connect.
    """
    if last_live is not None and seq <= last_live:
        return SeqAction.RESTART
    if not synced:
        return SeqAction.REPLAY
    if last_applied is None or seq == last_applied + 1:
        return SeqAction.APPLY
    if seq > last_applied + 1:
        return SeqAction.REPLAY
    return SeqAction.SKIP


async def request_replay(
    context: zmq.asyncio.Context, endpoint: str, start_seq: int, timeout_s: float = DEFAULT_REPLAY_TIMEOUT_S
) -> list[tuple[int, bytes]]:
    """Every (seq, payload) the engine's replay socket still buffers at or after `start_seq`.

    Raises TimeoutError when a frame takes longer than `timeout_s`. A fresh DEALER per request, so a reply
    to an abandoned request can never be mistaken for this one's.
    """
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(endpoint)
        await dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
        batches: list[tuple[int, bytes]] = []
        while True:
            frames = await asyncio.wait_for(dealer.recv_multipart(), timeout_s)
            seq_bytes, payload = frames[-2], frames[-1]  # a leading empty delimiter frame is optional
            if seq_bytes == END_SEQ:
                return batches
            batches.append((int.from_bytes(seq_bytes, "big"), payload))
    finally:
        dealer.close(linger=0)


def decode_or_empty(payload: bytes) -> tuple[EventBatch, bool]:
    """The decoded batch and True, or an empty batch and False when the payload does not decode."""
    try:
        return decode_batch(payload), True
    except Exception:  # malformed msgpack or a shape no vLLM version sends
        return EventBatch(ts=0.0, events=[]), False


@dataclass
class KVEventSubscriber:
    """Keeps `index` current with one engine's KV events. `start()` runs it as a task; `stop()` ends it."""

    endpoint: KVEventsEndpoint
    index: PrefixIndex
    context: zmq.asyncio.Context = field(default_factory=zmq.asyncio.Context.instance)
    replay_timeout_s: float = DEFAULT_REPLAY_TIMEOUT_S
    stats: SubscriberStats = field(default_factory=SubscriberStats)
    hash_checks: HashChecks | None = None
    _synced: bool = field(default=False, init=False)
    _last_live: int | None = field(default=None, init=False)
    _task: asyncio.Task | None = field(default=None, init=False)

    @property
    def engine_id(self) -> EngineId:
        return self.endpoint.engine_id

    def start(self) -> asyncio.Task:
        self._task = asyncio.create_task(self.run(), name=f"kv-events-{self.engine_id}")
        return self._task

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        self._task = None

    async def run(self) -> None:
        sub = self.context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.endpoint.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED)
        sub.connect(self.endpoint.publisher)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    await self._on_monitor_event(monitor)
                if sub in ready:
                    await self._on_live(await sub.recv_multipart())
        finally:
            if not sub.closed:  # the context may have been destroyed under us
                sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _on_monitor_event(self, monitor: zmq.asyncio.Socket) -> None:
        event = await recv_monitor_message(monitor)
        if event["event"] == zmq.EVENT_CONNECTED:
            self.stats.connects += 1
            self._synced = False
            await self._replay()

    async def _on_live(self, frames: list[bytes]) -> None:
        if len(frames) < 2 or len(frames[-2]) != 8:
            self.stats.decode_errors += 1  # not [topic, seq, payload]: nothing to number it by
            return
        seq = int.from_bytes(frames[-2], "big")
        action = self._classify(seq)
        if action is SeqAction.RESTART:
            log.info("kv events: %s restarted its numbering (seq %d)", self.engine_id, seq)
            self.stats.restarts += 1
            self.index.reset_engine(self.engine_id)
            if self.hash_checks is not None:
                self.hash_checks.reset(self.engine_id)
            self._last_live = None
        if action in (SeqAction.REPLAY, SeqAction.RESTART):
            await self._replay()
            action = self._classify(seq)
        self._last_live = seq
        if action is not SeqAction.SKIP:
            # the next batch, or a gap replay could not fill: apply what we have
            self._apply(seq, self._decode(frames[-1]))

    def _apply(self, seq: int, batch: EventBatch) -> None:
        if self.index.apply_batch(self.engine_id, seq, batch, allow_gap=True) is SeqCheck.APPLIED \
                and self.hash_checks is not None:
            self.hash_checks.observe(self.engine_id, batch)

    def _classify(self, seq: int) -> SeqAction:
        return classify_live(seq, self.index.last_seq(self.engine_id), self._last_live, self._synced)

    async def _replay(self) -> None:
        self._synced = True  # one attempt per (re)connect or gap, even if it fails
        if self.endpoint.replay is None:
            return
        start = self.index.next_seq(self.engine_id)
        try:
            batches = await request_replay(self.context, self.endpoint.replay, start, self.replay_timeout_s)
        except (TimeoutError, zmq.ZMQError) as exc:
            log.warning("kv events: replay from %s failed: %r", self.endpoint.replay, exc)
            self.stats.replay_failures += 1
            return
        self.stats.replays += 1
        for seq, payload in batches:
            self._apply(seq, self._decode(payload))
            self.stats.replayed_batches += 1

    def _decode(self, payload: bytes) -> EventBatch:
        batch, ok = decode_or_empty(payload)
        if not ok:
            self.stats.decode_errors += 1
        return batch


@dataclass
class KVSubscriberPool:
    """One subscriber per engine endpoint; `sync` follows the routing table's set of engines."""

    index: PrefixIndex
    context: zmq.asyncio.Context = field(default_factory=zmq.asyncio.Context.instance)
    replay_timeout_s: float = DEFAULT_REPLAY_TIMEOUT_S
    subscribers: dict[EngineId, KVEventSubscriber] = field(default_factory=dict)
    hash_checks: HashChecks | None = None

    async def sync(self, endpoints: Iterable[KVEventsEndpoint]) -> None:
        """Start subscribers for new endpoints; stop (and drop from the index) those gone or changed."""
        wanted = {e.engine_id: e for e in endpoints}
        for engine_id, subscriber in list(self.subscribers.items()):
            if wanted.get(engine_id) != subscriber.endpoint:
                await self._remove(engine_id)
        for engine_id, endpoint in wanted.items():
            if engine_id not in self.subscribers:
                subscriber = KVEventSubscriber(endpoint, self.index, self.context, self.replay_timeout_s,
                                               hash_checks=self.hash_checks)
                self.subscribers[engine_id] = subscriber
                subscriber.start()

    async def close(self) -> None:
        for engine_id in list(self.subscribers):
            await self._remove(engine_id)

    async def _remove(self, engine_id: EngineId) -> None:
        await self.subscribers.pop(engine_id).stop()
        self.index.drop_engine(engine_id)
        if self.hash_checks is not None:
            self.hash_checks.reset(engine_id)
