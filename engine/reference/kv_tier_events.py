"""The node tier's blocks on the engine's own KV event stream: what lets the gateway route to a tier hit.

vLLM's offloading connector publishes the blocks it holds in CPU memory or storage on the engine's KV event
stream, with medium "CPU" or "STORAGE". A reference engine's tier is the agent's (agent/kv_tiers), shared by
the node's engines of one layout, and changes when any of them offloads or the agent evicts. So each engine
reads the tier's event log for its own layout (`GET <tier>/events?layout=&after=SEQ`, the agent's numbering)
and publishes what it reads on its stream, as vLLM would: the gateway's index then knows which engines can
reach a block, and in which tier, without a second kind of subscription.

A read that comes back as a snapshot (the first one, or after the reader fell out of the log or the agent
restarted) is diffed against what this engine announced (`snapshot_events`), so the stream stays a correct
series of stored/removed events. (An engine that resets its prefix cache says AllBlocksCleared on its stream;
the gateway's index takes that to clear the engine's memory, not the tier's blocks.)

Reading is polled (every `interval_s`); a failed read is retried at the next poll, and events are never
invented: what the gateway may miss for a moment is a hit, never a wrong answer, because a fetch checks every
block's tokens.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

import httpx

from engine.kv_events import BlockRemoved, BlockStored, KVEvent

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.5


def stored(block_hash: int, medium: str) -> BlockStored:
    # a tier event carries no tokens or parent (vLLM's offloaded-block events don't by default either)
    return BlockStored(block_hashes=[block_hash], parent_block_hash=None, token_ids=[], block_size=0, medium=medium)


def snapshot_events(announced: Mapping[int, set[str]], snapshot: Mapping[int, Sequence[str]]) -> list[KVEvent]:
    """The events that turn what was announced into what the snapshot holds: removals first, then stores."""
    events: list[KVEvent] = []
    for block_hash, media in announced.items():
        for medium in sorted(media - set(snapshot.get(block_hash, ()))):
            events.append(BlockRemoved(block_hashes=[block_hash], medium=medium))
    for block_hash, media in snapshot.items():
        for medium in media:
            if medium not in announced.get(block_hash, ()):
                events.append(stored(block_hash, medium))
    return events


def apply_events(announced: dict[int, set[str]], events: Sequence[KVEvent]) -> None:
    """Keep `announced` (block hash -> media) in step with the events published."""
    for event in events:
        for block_hash in event.block_hashes:
            if isinstance(event, BlockStored):
                announced.setdefault(block_hash, set()).add(event.medium or "")
            elif isinstance(event, BlockRemoved):
                media = announced.get(block_hash, set())
                media.discard(event.medium or "")
                if not media:
                    announced.pop(block_hash, None)


def page_events(body: Mapping) -> tuple[int, list[KVEvent] | None, dict[int, list[str]] | None]:
    """(seq, events, snapshot) of the agent's answer; ValueError when it has another shape."""
    try:
        seq = int(body["seq"])
        if body.get("snapshot") is not None:
            return seq, None, {int(h): [str(m) for m in media] for h, media in body["snapshot"]}
        events: list[KVEvent] = []
        for kind, block_hash, medium in body["events"]:
            if kind == "stored":
                events.append(stored(int(block_hash), str(medium)))
            elif kind == "removed":
                events.append(BlockRemoved(block_hashes=[int(block_hash)], medium=str(medium)))
            else:
                raise ValueError(f"event kind {kind!r}")
        return seq, events, None
    except (KeyError, TypeError) as exc:
        raise ValueError(f"tier events: malformed answer ({exc!r})") from None


class TierEventRelay:
    """Reads the node tier's events for one layout and publishes them (see the module doc)."""

    def __init__(self, url: str, layout: str, *, token: str | None, publish: Callable[[list[KVEvent]], None],
                 client: Callable[[], httpx.AsyncClient], interval_s: float = DEFAULT_INTERVAL_S,
                 timeout_s: float = 2.0):
        self.url = url.rstrip("/")
        self.layout = layout
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.announced: dict[int, set[str]] = {}
        self.after = -1  # the agent's number of the last event read; -1: ask for a snapshot
        self.failures = 0
        self._publish = publish
        self._client = client
        self._auth = {"authorization": f"Bearer {token}"} if token else {}
        self._task: asyncio.Task | None = None

    async def poll_once(self) -> int:
        """One read; the number of events published."""
        response = await self._client().get(f"{self.url}/events", params={"layout": self.layout, "after": self.after},
                                            headers=self._auth, timeout=self.timeout_s)
        if response.status_code != 200:
            raise ValueError(f"HTTP {response.status_code}")
        seq, events, snapshot = page_events(response.json())
        if snapshot is not None:
            events = snapshot_events(self.announced, snapshot)
        assert events is not None
        if events:
            self._publish(events)
            apply_events(self.announced, events)
        self.after = seq
        return len(events)

    async def run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except (httpx.HTTPError, ValueError) as exc:
                self.failures += 1
                log.debug("KV tier events from %s: %r", self.url, exc)
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="kv-tier-events")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
