"""What the gateway reads from an engine's /metrics (vLLM's names; the reference engine uses the same), and the
rates it derives from two consecutive scrapes. Pure: text in, numbers out.

Read per scrape (`EngineSample`): the load gauges (running, waiting, KV usage), vllm:cache_config_info's labels
(block size, pool size in blocks, the reference engine's kv_cache_mib), and cumulative counters/histogram
sums from which `derive_rates` computes, between two scrapes:
- prefill throughput: d(prompt tokens computed) / d(sum of request prefill times), where computed is the
  by-source counter's local_compute when the engine has it (else prompt tokens less prefix-cache hits),
  only over intervals that computed at least MIN_PREFILL_TOKENS (a few short prompts measure the per-step
  overhead, not the throughput);
- decode step time: d(inter-token latency sum) / d(count);
- P/D transfers (reference engine, decode side): handoffs, seconds and bytes from fleet_kv_transfer_*.

Node KV tiers (reference engine): fleet_kv_tier_fetch_seconds{tier} counts blocks, so its lifetime sum/count per
tier is the engine's measured seconds per block fetched (`tier_fetch_s`), the price the scorer puts on a tier
hit there.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine import metric_names as m
from engine.contract import parse_labels, sample_lines

MIN_PREFILL_TOKENS = 256


@dataclass(frozen=True)
class EngineSample:
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # 0..1
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    kv_cache_mib: float | None = None  # reference engine only
    prompt_tokens: float = 0.0  # counters and histogram sums, cumulative
    prefix_cache_hits: float = 0.0
    prefix_cache_queries: float = 0.0
    prefill_time_sum: float = 0.0
    itl_sum: float = 0.0
    itl_count: float = 0.0
    kv_transfer_seconds_sum: float = 0.0
    kv_transfer_count: float = 0.0
    kv_transfer_bytes_sum: float = 0.0
    # vllm:prompt_tokens_by_source{source="local_compute"}: prompt tokens the engine computed, i.e. neither hit in
    # its cache nor loaded from elsewhere (a tier, a peer, a P/D transfer); None when the engine has no such series
    computed_prompt_tokens: float | None = None
    tier_fetch_dram_s: float = 0.0  # fleet_kv_tier_fetch_seconds{tier="dram"}: sum, and count (blocks)
    tier_fetch_dram_blocks: float = 0.0
    tier_fetch_disk_s: float = 0.0
    tier_fetch_disk_blocks: float = 0.0
    # cross-node fetches, by source node: (node, blocks, seconds) from fleet_kv_tier_peer_fetch_seconds{source}
    peer_fetches: tuple[tuple[str, float, float], ...] = ()

    def peer_links(self) -> dict[str, tuple[float, float]]:
        """Source node -> (bytes, seconds) of this engine's cross-node fetches from it (bytes from the block size
        in bytes); empty when the pool size is unknown."""
        block_bytes = self.kv_bytes_per_block
        if block_bytes is None:
            return {}
        return {node: (blocks * block_bytes, seconds) for node, blocks, seconds in self.peer_fetches}

    @property
    def tier_fetch_s(self) -> tuple[tuple[str, float], ...]:
        """Measured seconds per block fetched, by medium (CPU: the DRAM tier, STORAGE: disk); only those measured."""
        measured = []
        for medium, seconds, blocks in (("CPU", self.tier_fetch_dram_s, self.tier_fetch_dram_blocks),
                                        ("STORAGE", self.tier_fetch_disk_s, self.tier_fetch_disk_blocks)):
            if blocks > 0:
                measured.append((medium, seconds / blocks))
        return tuple(measured)

    @property
    def kv_capacity_tokens(self) -> int | None:
        if self.block_size is None or self.num_gpu_blocks is None:
            return None
        return self.block_size * self.num_gpu_blocks

    @property
    def kv_bytes_per_block(self) -> float | None:
        if self.kv_cache_mib is None or not self.num_gpu_blocks:
            return None
        return self.kv_cache_mib * 1024 * 1024 / self.num_gpu_blocks


_SUMMED = {
    m.NUM_REQUESTS_RUNNING: "num_running",
    m.NUM_REQUESTS_WAITING: "num_waiting",
    m.PROMPT_TOKENS + "_total": "prompt_tokens",
    m.PREFIX_CACHE_HITS + "_total": "prefix_cache_hits",
    m.PREFIX_CACHE_QUERIES + "_total": "prefix_cache_queries",
    m.REQUEST_PREFILL_TIME + "_sum": "prefill_time_sum",
    m.INTER_TOKEN_LATENCY + "_sum": "itl_sum",
    m.INTER_TOKEN_LATENCY + "_count": "itl_count",
    "fleet_kv_transfer_seconds_sum": "kv_transfer_seconds_sum",
    "fleet_kv_transfer_seconds_count": "kv_transfer_count",
    "fleet_kv_transfer_bytes_sum": "kv_transfer_bytes_sum",
}
_PEER_FETCH = {m.KV_TIER_PEER_FETCH_SECONDS + "_count": 0, m.KV_TIER_PEER_FETCH_SECONDS + "_sum": 1}
_TIER_FETCH = {  # (series, tier label) -> field
    (m.KV_TIER_FETCH_SECONDS + "_sum", "dram"): "tier_fetch_dram_s",
    (m.KV_TIER_FETCH_SECONDS + "_count", "dram"): "tier_fetch_dram_blocks",
    (m.KV_TIER_FETCH_SECONDS + "_sum", "disk"): "tier_fetch_disk_s",
    (m.KV_TIER_FETCH_SECONDS + "_count", "disk"): "tier_fetch_disk_blocks",
}


def parse_engine_metrics(text: str) -> EngineSample:
    """The sample in a Prometheus text exposition; series of every `engine` label (DP rank) are summed,
    KV usage is their mean. Unknown series are ignored; a wanted sample whose value does not parse raises
    ValueError.

    The contract's line scan (engine.contract.prometheus says why not a full parser): labels are parsed only
    for vllm:cache_config_info."""
    sums: dict[str, float] = {}
    usage: list[float] = []
    info: dict[str, str] = {}
    peer: dict[str, list[float]] = {}  # source node -> [blocks, seconds]
    computed: float | None = None
    for name, labels, value in sample_lines(text):
        field_name = _SUMMED.get(name)
        if field_name is not None:
            sums[field_name] = sums.get(field_name, 0.0) + value
        elif name == m.KV_CACHE_USAGE_PERC:
            usage.append(value)
        elif name == m.CACHE_CONFIG_INFO and not info:
            info = parse_labels(labels)
        elif name.startswith(m.KV_TIER_FETCH_SECONDS):
            tier_field = _TIER_FETCH.get((name, parse_labels(labels).get("tier")))
            if tier_field is not None:
                sums[tier_field] = sums.get(tier_field, 0.0) + value
        elif name == m.PROMPT_TOKENS_BY_SOURCE + "_total" and parse_labels(labels).get("source") == "local_compute":
            computed = (computed or 0.0) + value
        elif name in _PEER_FETCH:
            source = parse_labels(labels).get("source", "")
            peer.setdefault(source, [0.0, 0.0])[_PEER_FETCH[name]] += value
    return EngineSample(
        num_running=int(sums.pop("num_running", 0)),
        num_waiting=int(sums.pop("num_waiting", 0)),
        kv_cache_usage=sum(usage) / len(usage) if usage else 0.0,
        block_size=_int(info.get("block_size")),
        num_gpu_blocks=_int(info.get("num_gpu_blocks")),
        kv_cache_mib=_float(info.get("kv_cache_mib")),
        computed_prompt_tokens=computed,
        peer_fetches=tuple((node, blocks, seconds) for node, (blocks, seconds) in sorted(peer.items())),
        **sums,
    )


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "", "None") else None
    except ValueError:
        return None


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "", "None") else None
    except ValueError:
        return None


@dataclass(frozen=True)
class SampleRates:
    """What changed between two scrapes; None where nothing happened to measure."""

    prefill_tokens_per_s: float | None = None
    decode_step_s: float | None = None
    kv_transfers: int = 0
    kv_transfer_seconds: float = 0.0
    kv_transfer_bytes: float = 0.0


def derive_rates(before: EngineSample, after: EngineSample) -> SampleRates:
    """Rates between two scrapes of the same engine. A counter that went down (engine restart) gives nothing."""
    computed = computed_between(before, after)
    prefill_s = after.prefill_time_sum - before.prefill_time_sum
    itl_n = after.itl_count - before.itl_count
    itl_s = after.itl_sum - before.itl_sum
    transfers = after.kv_transfer_count - before.kv_transfer_count
    return SampleRates(
        prefill_tokens_per_s=computed / prefill_s if computed >= MIN_PREFILL_TOKENS and prefill_s > 0 else None,
        decode_step_s=itl_s / itl_n if itl_n > 0 and itl_s > 0 else None,
        kv_transfers=int(transfers) if transfers > 0 else 0,
        kv_transfer_seconds=max(0.0, after.kv_transfer_seconds_sum - before.kv_transfer_seconds_sum) if transfers > 0 else 0.0,
        kv_transfer_bytes=max(0.0, after.kv_transfer_bytes_sum - before.kv_transfer_bytes_sum) if transfers > 0 else 0.0,
    )


def computed_between(before: EngineSample, after: EngineSample) -> float:
    """Prompt tokens the engine computed between two scrapes: its by-source counter where it has one, else prompt
    tokens less prefix-cache hits (which would count tokens loaded from a tier or a peer as computed, and
    overstate the throughput of an engine that loads many)."""
    if before.computed_prompt_tokens is not None and after.computed_prompt_tokens is not None:
        return after.computed_prompt_tokens - before.computed_prompt_tokens
    return (after.prompt_tokens - after.prefix_cache_hits) - (before.prompt_tokens - before.prefix_cache_hits)


def ewma(previous: float | None, value: float | None, weight: float = 0.3) -> float | None:
    """Exponentially weighted moving average; either side may be missing."""
    if value is None:
        return previous
    if previous is None:
        return value
    return (1 - weight) * previous + weight * value
