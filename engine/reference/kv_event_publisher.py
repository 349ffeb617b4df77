"""Publishes the engine's KV cache events over ZMQ in vLLM's wire form (vllm/distributed/kv_events.py).

- PUB socket (bound to `endpoint`): one multipart message per engine step that changed the cache,
  `[topic, seq as 8-byte big-endian, msgpack EventBatch]` (engine.kv_events.encode_batch, events as maps);
  `seq` counts batches from 0.
- ROUTER replay socket (bound to `replay_endpoint`, optional): a client sends the 8-byte start seq and gets
  `(b"", seq, payload)` for every buffered batch at or after it, then `(b"", END_SEQ, b"")`. The buffer keeps
  the last `buffer_size` batches.

ZMQ sockets are not thread-safe, so both live on this publisher's own thread. `on_step` (an AsyncEngine step
listener, on the engine thread) only puts the step's events on a queue.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque

import zmq

from engine.kv_events import END_SEQ, KVEvent, encode_batch, make_batch
from engine.contract.outputs import StepResult

log = logging.getLogger(__name__)

DEFAULT_BUFFER_SIZE = 10_000  # vLLM's KVEventsConfig.buffer_steps
_POLL_MS = 50


class KVEventPublisher:
    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        data_parallel_rank: int = 0,
    ):
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self._queue: queue.Queue[list[KVEvent]] = queue.Queue()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_size)
        self._next_seq = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kv-event-publisher", daemon=True)

    def start(self) -> None:
        """Bind the sockets (on the publisher thread) and return once they are bound; raise if binding failed."""
        self._thread.start()
        self._ready.wait(timeout=10)
        if self._error is not None:
            raise self._error

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def on_step(self, result: StepResult) -> None:
        """AsyncEngine step listener: hand the step's events to the publisher thread."""
        if result.kv_events:
            self._queue.put(list(result.kv_events))

    def publish(self, events: list[KVEvent]) -> None:
        """Publish events that are not an engine step's (the node tier's, engine.reference.kv_tier_events)."""
        if events:
            self._queue.put(list(events))

    @property
    def published(self) -> int:
        """Batches sent so far (the next seq)."""
        return self._next_seq

    # --- the publisher thread -------------------------------------------------------------------------

    def _run(self) -> None:
        ctx = zmq.Context()
        pub = replay = None
        try:
            pub, replay = self._bind(ctx)
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._ready.set()
            self._close(ctx, pub, replay)
            return
        self._ready.set()
        poller = zmq.Poller()
        if replay is not None:
            poller.register(replay, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                self._publish_pending(pub)
                if replay is None:
                    self._stop.wait(_POLL_MS / 1000)
                elif dict(poller.poll(_POLL_MS)).get(replay):
                    self._serve_replay(replay)
            self._publish_pending(pub)
        except Exception:
            log.exception("KV event publisher failed")
        finally:
            self._close(ctx, pub, replay)

    def _bind(self, ctx: zmq.Context) -> tuple[zmq.Socket, zmq.Socket | None]:
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        pub.bind(self.endpoint)
        replay = None
        if self.replay_endpoint:
            replay = ctx.socket(zmq.ROUTER)
            replay.setsockopt(zmq.LINGER, 0)
            try:
                replay.bind(self.replay_endpoint)
            except zmq.ZMQError:
                pub.close()
                replay.close()
                raise
        return pub, replay

    @staticmethod
    def _close(ctx: zmq.Context, *sockets: zmq.Socket | None) -> None:
        for sock in sockets:
            if sock is not None:
                sock.close(linger=0)
        ctx.term()

    def _publish_pending(self, pub: zmq.Socket) -> None:
        while True:
            try:
                events = self._queue.get_nowait()
            except queue.Empty:
                return
            self._publish(pub, events)

    def _publish(self, pub: zmq.Socket, events: list[KVEvent]) -> None:
        batch = make_batch(events)
        batch.data_parallel_rank = self.data_parallel_rank
        payload = encode_batch(batch)
        seq = self._next_seq
        self._next_seq += 1
        self._buffer.append((seq, payload))
        pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))

    def _serve_replay(self, replay: zmq.Socket) -> None:
        frames = replay.recv_multipart()
        # REQ-style clients send (id, b"", start); a DEALER that skips the delimiter sends (id, start).
        if len(frames) not in (2, 3) or len(frames[-1]) != 8:
            log.warning("invalid KV event replay request: %d frames", len(frames))
            return
        client_id, start = frames[0], int.from_bytes(frames[-1], "big")
        for seq, payload in list(self._buffer):
            if seq >= start:
                replay.send_multipart((client_id, b"", seq.to_bytes(8, "big"), payload))
        replay.send_multipart((client_id, b"", END_SEQ, b""))
