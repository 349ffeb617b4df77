"""The reference engine's side of the node's KV tiers (hosted by the agent: agent/kv_tiers).

Offload (`TierOffloader`). The block manager lists the hashed blocks it evicts; the engine thread copies
their K/V once (llm_engine._offload_evicted) and hands them here. A background thread splits them into
blocks, frames them (engine.contract.kv_tier) and POSTs them to the agent. The engine thread never waits: the
queue has a fixed size in blocks, and what does not fit is not copied at all (`room()`), so a tier that cannot
keep up costs the decode loop nothing but the offloads it drops (counted).

Fetch (`TierFetcher`). Before a request goes to the engine, its prompt's full blocks are hashed; if the
engine's own cache holds fewer leading blocks than the prompt has, the tier is asked for the ones after them,
with their tokens. The agent answers with the leading run it holds with those tokens; each block is checked
again here (hash, tokens, checksum). The run becomes external K/V that starts at the engine's first missing
block, loaded like a P/D transfer. Any failure, timeout or mismatch means: compute the prompt, never a wrong
answer. The fetch runs on the event loop, beside the engine thread, so it delays only its own request.

Layout (`engine_layout`): what decides the meaning of the K/V bytes, from the engine's own configuration (for
the tiny model its seed is part of its weights).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx
import torch

from engine.contract.kv_tier import (
    TIER_FRAME_MEDIA_TYPE,
    MEDIA_HEADER,
    TIER_TOKEN_ENV,
    TierBlock,
    TierFrameError,
    decode_tier_frame,
    encode_tier_frame,
    kv_layout_key,
)
from engine import metric_names
from engine.hashing import BlockHash, hash_block_tokens, to_int64
from engine.reference.block_manager import EvictedBlock
from engine.reference.config import EngineConfig
from engine.reference.engine_port import EnginePort
from engine.reference.kv_decode import ExternalKV

log = logging.getLogger(__name__)

SEND_BATCH_BLOCKS = 32  # blocks per offload POST


def engine_layout(config: EngineConfig, block_shape: Sequence[int], kv_dtype: torch.dtype) -> str:
    weights = config.model if config.model != "tiny" else f"tiny:seed={config.seed}"
    return kv_layout_key(weights=weights, weights_revision="main", dtype=config.dtype,
                         kv_cache_dtype=str(kv_dtype).removeprefix("torch."), rope_scaling=config.rope_scaling,
                         block_size=config.block_size, block_shape=list(block_shape))


def block_payload(kv: torch.Tensor, index: int) -> bytes:
    """Block `index` of an exported [layers, 2, n, bs, h, d] tensor as its bytes in C order ([layers, 2, bs,
    h, d]); through uint8, so every KV dtype (bfloat16 too) round-trips bit-exact."""
    return kv[:, :, index].contiguous().view(torch.uint8).numpy().tobytes()


def payload_tensor(payload: bytes, kv_dtype: torch.dtype, block_shape: Sequence[int]) -> torch.Tensor:
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(kv_dtype).reshape(*block_shape)


@dataclass
class TierCounters:
    offloaded: int = 0  # blocks the agent took
    dropped_full: int = 0  # evicted blocks the queue had no room for
    dropped_failed: int = 0  # blocks lost to a failed send
    fetched: int = 0  # blocks loaded from a tier
    fetch_failures: int = 0
    fetched_by_medium: dict[str, int] = field(default_factory=dict)  # "dram" | "disk" -> blocks
    # the fetches that returned blocks, by the slowest tier among their blocks: request-to-tensor seconds and
    # blocks, summed (their ratio is the measured cost of a block from that tier)
    fetch_seconds: dict[str, float] = field(default_factory=dict)
    fetch_blocks: dict[str, int] = field(default_factory=dict)


class TierOffloader:
    """Evicted blocks to the agent, from a background thread (see the module doc)."""

    def __init__(self, url: str, layout: str, *, token: str | None, max_queued_blocks: int = 256,
                 timeout_s: float = 5.0, counters: TierCounters | None = None,
                 post: Callable[[bytes], int] | None = None):
        self.url = url.rstrip("/")
        self.layout = layout
        self.counters = counters or TierCounters()
        self.max_queued_blocks = max_queued_blocks
        self._headers = {"content-type": TIER_FRAME_MEDIA_TYPE}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._timeout_s = timeout_s
        self._post = post or self._http_post
        self._queue: deque[TierBlock] = deque()
        self._pending: deque[tuple[list[EvictedBlock], torch.Tensor]] = deque()
        self._queued = 0  # blocks waiting, split or not
        self._lock = threading.Condition()
        self._closed = False
        self._client: httpx.Client | None = None
        self._thread = threading.Thread(target=self._run, name="kv-tier-offload", daemon=True)
        self._thread.start()

    # engine thread

    def room(self) -> int:
        with self._lock:
            return max(0, self.max_queued_blocks - self._queued)

    def offer(self, blocks: list[EvictedBlock], kv: torch.Tensor) -> None:
        with self._lock:
            self._pending.append((blocks, kv))
            self._queued += len(blocks)
            self._lock.notify()

    def skipped(self, count: int) -> None:
        with self._lock:
            self.counters.dropped_full += count

    # sender thread

    def close(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout_s)
        if self._client is not None:
            self._client.close()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything offered was sent (tests and shutdown)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._queued and time.monotonic() < deadline:
                self._lock.wait(0.05)
            return self._queued == 0

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._queue and not self._closed:
                    self._lock.wait()
                if self._closed and not self._pending and not self._queue:
                    return
                pending = list(self._pending)
                self._pending.clear()
            for blocks, kv in pending:
                self._queue.extend(TierBlock.make(self.layout, to_int64(b.block_hash), b.token_ids,
                                                  block_payload(kv, i)) for i, b in enumerate(blocks))
            while self._queue:
                batch = [self._queue.popleft() for _ in range(min(SEND_BATCH_BLOCKS, len(self._queue)))]
                self._send(batch)
                with self._lock:
                    self._queued -= len(batch)
                    self._lock.notify_all()

    def _send(self, batch: list[TierBlock]) -> None:
        try:
            status = self._post(encode_tier_frame(self.layout, batch))
        except (httpx.HTTPError, OSError) as exc:
            log.info("KV tier offload to %s failed: %r", self.url, exc)
            status = 0
        if status == 200:
            self.counters.offloaded += len(batch)
        else:
            self.counters.dropped_failed += len(batch)

    def _http_post(self, frame: bytes) -> int:
        if self._client is None:
            self._client = httpx.Client(timeout=self._timeout_s)
        return self._client.post(f"{self.url}/blocks", content=frame, headers=self._headers).status_code


class TierFetcher:
    """A prompt's missing leading blocks from the node's tier (see the module doc)."""

    def __init__(self, url: str, layout: str, *, token: str | None, block_size: int, hash_seed: str,
                 kv_dtype: torch.dtype, block_shape: Sequence[int], cached_prefix_blocks: Callable[[list], int],
                 client: Callable[[], httpx.AsyncClient], timeout_s: float = 2.0,
                 counters: TierCounters | None = None):
        self.url = url.rstrip("/")
        self.layout = layout
        self.block_size = block_size
        self.hash_seed = hash_seed
        self.kv_dtype = kv_dtype
        self.block_shape = tuple(block_shape)
        self.timeout_s = timeout_s
        self.counters = counters or TierCounters()
        self._cached_prefix_blocks = cached_prefix_blocks
        self._client = client
        self._auth = {"authorization": f"Bearer {token}"} if token else {}

    def prompt_blocks(self, prompt_ids: Sequence[int]) -> tuple[list[BlockHash], list[tuple[int, ...]]]:
        """The chained hashes and tokens of the blocks a prefix lookup may hit (never the prompt's last token)."""
        count = (len(prompt_ids) - 1) // self.block_size
        hashes, tokens, parent = [], [], None
        for index in range(count):
            block = tuple(prompt_ids[index * self.block_size : (index + 1) * self.block_size])
            parent = hash_block_tokens(parent, block, None, self.hash_seed)
            hashes.append(parent)
            tokens.append(block)
        return hashes, tokens

    async def acquire(self, prompt_ids: Sequence[int]) -> ExternalKV | None:
        """External K/V for the prompt's blocks after the ones the engine holds, or None (compute them)."""
        hashes, tokens = self.prompt_blocks(prompt_ids)
        own = self._cached_prefix_blocks(hashes)
        if own >= len(hashes):
            return None
        wanted = [to_int64(h) for h in hashes[own:]]
        start = time.monotonic()
        try:
            blocks, media = await self._fetch(wanted, tokens[own:])
        except (httpx.HTTPError, TierFrameError, ValueError) as exc:
            self.counters.fetch_failures += 1
            log.info("KV tier fetch from %s failed (%r); computing the prompt", self.url, exc)
            return None
        if not blocks:
            return None
        kv = await asyncio.to_thread(self._tensor, blocks)
        self._count(media, len(blocks), time.monotonic() - start)
        return ExternalKV(kv, (own + len(blocks)) * self.block_size, first_block=own)

    def _count(self, media: list[str], blocks: int, seconds: float) -> None:
        counters = self.counters
        counters.fetched += blocks
        for medium in media[:blocks]:
            counters.fetched_by_medium[medium] = counters.fetched_by_medium.get(medium, 0) + 1
        slowest = "disk" if "disk" in media[:blocks] else "dram"
        counters.fetch_seconds[slowest] = counters.fetch_seconds.get(slowest, 0.0) + seconds
        counters.fetch_blocks[slowest] = counters.fetch_blocks.get(slowest, 0) + blocks

    async def _fetch(self, hashes: list[int], tokens: list[tuple[int, ...]]) -> tuple[list[TierBlock], list[str]]:
        body = {"layout": self.layout, "hashes": hashes, "tokens": [list(t) for t in tokens]}
        response = await self._client().post(f"{self.url}/fetch", json=body, headers=self._auth,
                                             timeout=self.timeout_s)
        if response.status_code != 200:
            raise ValueError(f"HTTP {response.status_code}")
        layout, blocks = await asyncio.to_thread(decode_tier_frame, response.content)
        if layout != self.layout:
            raise ValueError(f"layout {layout} for {self.layout}")
        expected_bytes = self._block_bytes()
        for block, block_hash, block_tokens in zip(blocks, hashes, tokens):
            if block.block_hash != block_hash or block.token_ids != block_tokens or block.nbytes != expected_bytes:
                raise ValueError(f"block {block.block_hash} is not the one asked for")
        if len(blocks) > len(hashes):
            raise ValueError(f"{len(blocks)} blocks for {len(hashes)} asked")
        media = [m for m in response.headers.get(MEDIA_HEADER, "").split(",") if m]
        return blocks, media

    def _block_bytes(self) -> int:
        count = 1
        for size in self.block_shape:
            count *= size
        return count * torch.empty((), dtype=self.kv_dtype).element_size()

    def _tensor(self, blocks: list[TierBlock]) -> torch.Tensor:
        """[layers, 2, n, bs, h, d] from the blocks' payloads."""
        return torch.stack([payload_tensor(b.payload, self.kv_dtype, self.block_shape) for b in blocks], dim=2)


class KVTierLink:
    """An engine's link to its node's tier (`config.kv_tier_url`): the offloader, the fetcher and their
    counters, exported as fleet_kv_tier_* metrics."""

    def __init__(self, engine: EnginePort, config: EngineConfig, client: Callable[[], httpx.AsyncClient]):
        assert config.kv_tier_url is not None
        self.engine = engine
        self.config = config
        self._client = client
        self.layout = engine_layout(config, engine.kv_block_shape, engine.kv_dtype)
        token = self.token = os.environ.get(TIER_TOKEN_ENV) or None
        self.counters = TierCounters()
        self.offloader = TierOffloader(config.kv_tier_url, self.layout, token=token, counters=self.counters,
                                       max_queued_blocks=config.kv_tier_queue_blocks)
        self.fetcher = self._fetcher(config.kv_tier_url, token, self.counters)
        self.peer_counters: dict[str, TierCounters] = {}  # by the source node of cross-node fetches
        self._peer_token = config.api_key  # peers' /kv/tier/fetch takes the fleet's engine key, as P/D does

    def _fetcher(self, url: str, token: str | None, counters: TierCounters) -> TierFetcher:
        engine, config = self.engine, self.config
        return TierFetcher(url, self.layout, token=token, block_size=config.block_size, hash_seed=config.hash_seed,
                           kv_dtype=engine.kv_dtype, block_shape=engine.kv_block_shape,
                           cached_prefix_blocks=engine.cached_prefix_blocks, client=self._client,
                           timeout_s=config.kv_tier_timeout_s, counters=counters)

    async def acquire(self, prompt_ids: Sequence[int], peer: tuple[str, str] | None = None) -> ExternalKV | None:
        """The prompt's blocks after the engine's own: from the peer the gateway named (kv_tier_peer), else, or
        when the peer fails, from the node's tier; None: compute them."""
        if peer is not None:
            url, node = peer
            counters = self.peer_counters.setdefault(node, TierCounters())
            external = await self._fetcher(f"{url}/kv/tier", self._peer_token, counters).acquire(prompt_ids)
            if external is not None:
                return external
        return await self.fetcher.acquire(prompt_ids)

    async def serve_peer(self, body: bytes) -> tuple[int, bytes, str]:
        """A peer's fetch, read from this node's tier: (status, tier frame or error body, media header)."""
        headers = {"content-type": "application/json", **self.fetcher._auth}
        try:
            response = await self._client().post(f"{self.fetcher.url}/fetch", content=body, headers=headers,
                                                 timeout=self.config.kv_tier_timeout_s)
        except httpx.HTTPError as exc:
            log.info("KV tier fetch for a peer failed: %r", exc)
            return 502, b'{"error": {"message": "the node tier did not answer", "type": "BadGateway"}}', ""
        return response.status_code, response.content, response.headers.get(MEDIA_HEADER, "")

    def start(self) -> None:
        self.engine.submit(lambda core: core.set_tier_sink(self.offloader)).result()

    async def aclose(self) -> None:
        self.engine.submit(lambda core: core.set_tier_sink(None))
        await asyncio.to_thread(self.offloader.close)

    def collect(self):
        """prometheus_client collector protocol: the counters as fleet_kv_tier_* families."""
        from prometheus_client.core import CounterMetricFamily, SummaryMetricFamily

        c = self.counters
        offloaded = CounterMetricFamily(metric_names.KV_TIER_OFFLOADED_BLOCKS,
                                        "Evicted blocks the node's KV tier took.")
        offloaded.add_metric([], c.offloaded)
        dropped = CounterMetricFamily(metric_names.KV_TIER_OFFLOAD_DROPPED_BLOCKS, "Evicted blocks not offloaded: the "
                                      "queue was full (queue_full) or the send failed (send_failed).",
                                      labels=["reason"])
        dropped.add_metric(["queue_full"], c.dropped_full)
        dropped.add_metric(["send_failed"], c.dropped_failed)
        fetched = CounterMetricFamily("fleet_kv_tier_fetched_blocks", "Prompt blocks loaded from the node's KV "
                                      "tier, by the tier that held them (dram, disk).", labels=["tier"])
        for tier in ("dram", "disk"):
            fetched.add_metric([tier], c.fetched_by_medium.get(tier, 0))
        seconds = SummaryMetricFamily(metric_names.KV_TIER_FETCH_SECONDS, "Seconds from asking the tier to holding the "
                                      "blocks, summed over fetches; the count is blocks, so sum/count is seconds "
                                      "per block. tier: the slowest tier a fetch read (disk if any block came "
                                      "from disk).", labels=["tier"])
        for tier in ("dram", "disk"):
            seconds.add_metric([tier], count_value=c.fetch_blocks.get(tier, 0),
                               sum_value=c.fetch_seconds.get(tier, 0.0))
        failures = CounterMetricFamily("fleet_kv_tier_fetch_failures", "Tier fetches that failed (the prompt was "
                                       "computed).")
        failures.add_metric([], c.fetch_failures)
        return [offloaded, dropped, fetched, seconds, failures, *self._peer_families()]

    def _peer_families(self):
        from prometheus_client.core import CounterMetricFamily, SummaryMetricFamily

        fetched = CounterMetricFamily(metric_names.KV_TIER_PEER_FETCHED_BLOCKS, "Prompt blocks loaded from another "
                                      "node's tier through an engine there, by that node.", labels=["source"])
        seconds = SummaryMetricFamily(metric_names.KV_TIER_PEER_FETCH_SECONDS, "Seconds of the cross-node fetches "
                                      "that returned blocks, by source node; the count is blocks.",
                                      labels=["source"])
        failures = CounterMetricFamily(metric_names.KV_TIER_PEER_FETCH_FAILURES, "Cross-node fetches that failed "
                                       "(refused, corrupt, timed out); the engine went on without them.",
                                       labels=["source"])
        for node, c in sorted(self.peer_counters.items()):
            fetched.add_metric([node], c.fetched)
            seconds.add_metric([node], count_value=sum(c.fetch_blocks.values()),
                               sum_value=sum(c.fetch_seconds.values()))
            failures.add_metric([node], c.fetch_failures)
        return [fetched, seconds, failures]
