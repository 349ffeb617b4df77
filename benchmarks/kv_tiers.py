"""The node's KV tiers on a local fleet: prefix hits, TTFT and decode cost with engine memory only and with the
agent's DRAM and disk tiers behind it, on multi-turn traffic, in one run.

    .venv/bin/python benchmarks/kv_tiers.py [--requests 600] [--rps 2.0] [--kv-cache-mib 24]

A local fleet (`fleetctl up`, one node, SmolLM2). Each phase deploys one engine of a class made from the fleet's
own, with a deliberately small KV pool (`--kv-cache-mib`), and replays the first `--requests` rows of
../shared/traces/mooncake_conversation.jsonl through the gateway (open loop at `--rps`, streamed, greedy,
`--max-tokens` output tokens; benchmarks/rollout_traffic.py builds the prompts: each 512-token trace block is 16
real tokens, so the trace's prefix sharing survives):
- `memory`: engine memory only;
- `tiers`: the same pool, with `kv_tiers: {dram_mib, disk_mib}` (the agent's tiers, shared by the node's
  engines of the class);
- `warm restart`: the agent restarted (its engines stop with it; its DRAM tier is gone, its disk tier is
  rebuilt from disk and verified), then a fresh engine of the `tiers` class and the first `--restart-requests`
  rows again; `cold restart`: the same after flushing the class's tiers (`POST /kv/flush`), so the disk is
  empty too.
Per phase, from the engine's own counters (a fresh engine per phase, so they start at zero): prompt tokens
served from its cache (`local_cache_hit`) and from the tier (`external_kv_transfer`) over all prompt tokens; p99
inter-token latency (vllm:inter_token_latency_seconds); and, from the client, P50/P90 TTFT and p99 TPOT (a
request's mean time per output token after the first). A second memory-only run after the tiers run gives
the run-to-run noise of each figure. The ceiling is the hit
rate of an infinite cache: the leading full blocks of each prompt that an earlier prompt of the slice already had.
Fetch cost per block and tier, from the engine (fleet_kv_tier_fetch_seconds{tier}: request to tensor, by
the slowest tier a fetch read), beside the engine's prefill time per block it computed
(vllm:request_prefill_time_seconds over its computed blocks); per tier, from the agent (`GET /kv/status`):
blocks held, hits, misses, corrupt blocks. Results: a table
on stdout and benchmarks/results/kv_tiers.json. Run it alone on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
from collections import Counter
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import BlockText, histogram_quantile, log, metric_sum, percentile, print_table, reference_tokenizer_dir, scrape, wait, write_json  # noqa: E402,E501
from benchmarks.rollout import measure_on_a_fleet  # noqa: E402
from benchmarks.rollout_traffic import Req, Traffic, arrival_offsets, build_requests  # noqa: E402
from fleetctl.client import ControllerClient  # noqa: E402
from fleetctl.inventory import AGENT_CREDENTIAL_FILE  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "kv_tiers.json"
BLOCK = 16
GOALS = {"hit_rate_of_ceiling": 0.9}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    p.add_argument("--requests", type=int, default=600, help="trace rows replayed per phase")
    p.add_argument("--restart-requests", type=int, default=50, help="rows replayed after a restart")
    p.add_argument("--rps", type=float, default=2.0)
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--kv-cache-mib", type=int, default=24, help="the engine's own KV pool (small on purpose)")
    p.add_argument("--dram-mib", type=int, default=128)
    p.add_argument("--disk-mib", type=int, default=8192)
    p.add_argument("--out", type=Path, default=OUT)
    return p.parse_args(argv)


def start_fleet(args: argparse.Namespace, state_dir: Path) -> Any:
    import random

    from fleetctl.localfleet import UpOptions, up

    options = UpOptions(state_dir=state_dir, nodes=1, model=args.model, controller_port=0, gateway_port=0,
                        engine_port_base=random.randrange(20_000, 40_000, 1_000), ready_timeout_s=600.0)
    return up(options, progress=log)


class Fleet:
    """The benchmark's handle on the local fleet: deploy one engine of a class, wait for it, find its agent."""

    def __init__(self, record: Any):
        self.record = record
        token = Path(record.token_file).read_text().strip()
        self.client = ControllerClient(record.controller_url, token=token)
        self.model = record.served_model
        self.base = dict(self.client.get_class(record.class_ref).spec)
        agent = next(p for p in record.processes if p.kind == "agent")
        self.agent_url, self.node = agent.url, agent.name

    def apply(self, name: str, **changes: Any) -> str:
        return self.client.apply_class(name, {**self.base, **changes}).ref

    def clear(self) -> None:
        """Every deployment removed, and its engines gone."""
        for deployment in self.client.list_deployments():
            self.client.delete_deployment(deployment.name, reason="kv tier benchmark")
        wait(lambda: not self.client.list_engines(), 300, "the engines to stop", every_s=1.0)

    def serve_only(self, class_ref: str) -> str:
        """One fresh engine of `class_ref` and nothing else; its URL once the gateway routes to it."""
        self.clear()
        name = "kvb-" + class_ref.replace("@", "-")
        self.client.set_deployment(name, class_ref, 1, model=self.model, reason="kv tier benchmark")

        def ready() -> str | None:
            engines = [e for e in self.client.list_engines() if e.class_ref == class_ref and e.state == "ready"]
            return engines[0].url if engines and self._routed(engines[0].name) else None

        return wait(ready, 600, f"a ready engine of {class_ref}", every_s=1.0)

    def restart_agent(self, flush_class: str | None = None) -> None:
        """The node's agent restarted with no engine running; with `flush_class`, that class's tiers flushed
        first (a cold disk)."""
        from fleetctl.localfleet.fleet import restart_agent

        self.clear()
        if flush_class is not None:
            agent_dir = Path(self.record.state_dir) / "agents" / self.node
            credential = (agent_dir / AGENT_CREDENTIAL_FILE).read_text().strip()
            response = httpx.post(f"{self.agent_url}/kv/flush", json={"class": flush_class, "reason": "benchmark"},
                                  headers={"authorization": f"Bearer {credential}"}, timeout=60)
            response.raise_for_status()
        restart_agent(self.record, self.node)

    def _routed(self, engine: str) -> bool:
        """The gateway has the engine in its table, healthy (GET /health lists the engines it routes to)."""
        try:
            engines = httpx.get(f"{self.record.gateway_url}/health", timeout=5).json().get("engines", {})
        except (httpx.HTTPError, ValueError):
            return False
        return bool(engines.get(engine, {}).get("healthy"))

    def tier_status(self) -> list[dict[str, Any]]:
        return httpx.get(f"{self.agent_url}/kv/status", timeout=10).json()["tiers"]


def replay(fleet: Fleet, requests: list[Req], rps: float) -> list[Any]:
    traffic = Traffic([fleet.record.gateway_url], fleet.model, requests, arrival_offsets([], rps, "steady")).start()
    deadline = time.monotonic() + len(requests) / rps + 300
    while len(traffic.results) < len(requests) and time.monotonic() < deadline:
        time.sleep(0.5)
    traffic.stop(drain_s=5)
    return list(traffic.results)[: len(requests)]


def phase(fleet: Fleet, label: str, class_ref: str, requests: list[Req], rps: float) -> dict[str, Any]:
    log(f"{label}: one engine of {class_ref}")
    engine_url = fleet.serve_only(class_ref)
    started = time.monotonic()
    results = replay(fleet, requests, rps)
    samples = scrape(engine_url)
    prompt = metric_sum(samples, "vllm:prompt_tokens_total")
    by_source = {s: metric_sum(samples, "vllm:prompt_tokens_by_source_total", source=s)
                 for s in ("local_compute", "local_cache_hit", "external_kv_transfer")}
    prefill_s = metric_sum(samples, "vllm:request_prefill_time_seconds_sum")
    ttfts = [r.ttft_s for r in results if not r.failed and not math.isnan(r.ttft_s)]
    tpots = [(r.finished_at - r.sent_at - r.ttft_s) / (r.tokens - 1) for r in results
             if not r.failed and r.tokens > 1 and not math.isnan(r.ttft_s) and not math.isnan(r.finished_at)]
    row = {"phase": label, "class": class_ref, "seconds": time.monotonic() - started, "requests": len(results),
           "failed": sum(1 for r in results if r.failed),
           "failures": dict(Counter(f"{r.status} {r.error or ''}".strip()[:120] for r in results if r.failed)),
           "prompt_tokens": prompt, **by_source,
           "hit_rate": (by_source["local_cache_hit"] + by_source["external_kv_transfer"]) / prompt if prompt else None,
           "ttft_p50_s": percentile(ttfts, 50) if ttfts else None,
           "ttft_p90_s": percentile(ttfts, 90) if ttfts else None,
           "itl_p99_s": histogram_quantile(samples, "vllm:inter_token_latency_seconds", 0.99),
           "tpot_p99_s": percentile(tpots, 99) if tpots else None,
           "prefill_s_per_computed_block": prefill_s / (by_source["local_compute"] / BLOCK)
           if by_source["local_compute"] else None,
           "tier_fetched_blocks": {tier: metric_sum(samples, "fleet_kv_tier_fetched_blocks_total", tier=tier)
                                   for tier in ("dram", "disk")},
           "dram_fetch_s_per_block": per_block(samples, "dram"), "disk_fetch_s_per_block": per_block(samples, "disk"),
           "tier_offload_dropped": metric_sum(samples, "fleet_kv_tier_offload_dropped_blocks_total")}
    log(f"  hit rate {row['hit_rate']:.3f}, TTFT p90 {row['ttft_p90_s']:.3f} s, ITL p99 {row['itl_p99_s']:.3f} s")
    return row


def per_block(samples: Any, tier: str) -> float | None:
    """Seconds per block fetched in fetches whose slowest tier was `tier` (None: none)."""
    blocks = metric_sum(samples, "fleet_kv_tier_fetch_seconds_count", tier=tier)
    return metric_sum(samples, "fleet_kv_tier_fetch_seconds_sum", tier=tier) / blocks if blocks else None


def ceiling(blocks: BlockText, requests: list[Req]) -> float:
    """The hit rate of an infinite cache over the slice, in prompt tokens (a lookup never hits the last token)."""
    seen: set[tuple[int, ...]] = set()
    hit = total = 0
    for req in requests:
        ids = blocks.encode(req.prompt)
        total += len(ids)
        chain: tuple[int, ...] = ()
        full = (len(ids) - 1) // BLOCK
        hits_here, missed = 0, False
        for index in range(full):
            chain = chain + tuple(ids[index * BLOCK : (index + 1) * BLOCK])
            key = (len(chain), hash(chain))
            if not missed and key in seen:
                hits_here += BLOCK
            else:
                missed = True
            seen.add(key)
        hit += hits_here
    return hit / total if total else 0.0


def measure(args: argparse.Namespace, record: Any) -> dict[str, Any]:
    fleet = Fleet(record)
    blocks = BlockText(reference_tokenizer_dir(), BLOCK)
    requests = build_requests(blocks, BLOCK, args.max_prompt_tokens, args.max_tokens, limit=args.requests)
    tiers = {"dram_mib": args.dram_mib, "disk_mib": args.disk_mib}
    memory_ref = fleet.apply("kvb-memory", kv_cache_mib=args.kv_cache_mib)
    tier_ref = fleet.apply("kvb-tiers", kv_cache_mib=args.kv_cache_mib, kv_tiers=tiers)
    report: dict[str, Any] = {"benchmark": "kv_tiers", "command": "benchmarks/kv_tiers.py " + " ".join(sys.argv[1:]),
                              "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                              "machine": {"platform": platform.platform()}, "ceiling": ceiling(blocks, requests)}
    log(f"ceiling (infinite cache) hit rate: {report['ceiling']:.3f}")
    report["phases"] = [phase(fleet, "memory", memory_ref, requests, args.rps),
                        phase(fleet, "tiers", tier_ref, requests, args.rps)]
    report["tiers_after"] = [t for t in fleet.tier_status() if t["class_name"] == "kvb-tiers"]
    report["phases"].append(phase(fleet, "memory again", memory_ref, requests, args.rps))  # run-to-run noise
    first = requests[: args.restart_requests]
    fleet.restart_agent()
    report["phases"].append(phase(fleet, "warm restart", tier_ref, first, args.rps))
    report["tiers_warm"] = [t for t in fleet.tier_status() if t["class_name"] == "kvb-tiers"]
    fleet.restart_agent(flush_class="kvb-tiers")
    report["phases"].append(phase(fleet, "cold restart", tier_ref, first, args.rps))
    report["summary"] = summary(report)
    report["tiers_end"] = fleet.tier_status()
    return report


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The issue's figures: hit rates against the ceiling, TTFT and ITL ratios tiers : memory (beside the two
    memory-only runs' own ratio, the run-to-run noise), warm : cold restart."""
    by = {row["phase"]: row for row in report["phases"]}
    memory, again, tiers = by["memory"], by["memory again"], by["tiers"]

    def ratio(a: dict[str, Any], b: dict[str, Any], key: str) -> float | None:
        return a[key] / b[key] if a.get(key) and b.get(key) else None

    ceiling_rate = report["ceiling"]
    return {
        "memory_hit_rate_of_ceiling": memory["hit_rate"] / ceiling_rate if ceiling_rate else None,
        "tiers_hit_rate_of_ceiling": tiers["hit_rate"] / ceiling_rate if ceiling_rate else None,
        "ttft_p90_tiers_over_memory": ratio(tiers, memory, "ttft_p90_s"),
        "itl_p99_tiers_over_memory": ratio(tiers, memory, "itl_p99_s"),
        "itl_p99_memory_again_over_memory": ratio(again, memory, "itl_p99_s"),
        "tpot_p99_tiers_over_memory": ratio(tiers, memory, "tpot_p99_s"),
        "tpot_p99_memory_again_over_memory": ratio(again, memory, "tpot_p99_s"),
        "ttft_p90_memory_again_over_memory": ratio(again, memory, "ttft_p90_s"),
        "restart_ttft_p50_warm_over_cold": ratio(by["warm restart"], by["cold restart"], "ttft_p50_s"),
        "restart_ttft_p90_warm_over_cold": ratio(by["warm restart"], by["cold restart"], "ttft_p90_s"),
    }


def print_report(report: dict[str, Any]) -> None:
    print(f"ceiling hit rate: {report['ceiling']:.3f}")
    print_table(report["phases"], [("phase", "phase", ""), ("requests", "requests", "d"), ("failed", "failed", "d"),
                                   ("hit rate", "hit_rate", ".3f"), ("from tier (tok)", "external_kv_transfer", ".0f"),
                                   ("TTFT p50 (s)", "ttft_p50_s", ".3f"), ("TTFT p90 (s)", "ttft_p90_s", ".3f"),
                                   ("ITL p99 (s)", "itl_p99_s", ".4f"), ("TPOT p99 (s)", "tpot_p99_s", ".4f"),
                                   ("prefill s/block", "prefill_s_per_computed_block", ".4f"),
                                   ("DRAM fetch s/block", "dram_fetch_s_per_block", ".4f"),
                                   ("disk fetch s/block", "disk_fetch_s_per_block", ".4f"),
                                   ("offload dropped", "tier_offload_dropped", ".0f")])
    print_table(report["tiers_after"], [("tier", "tier", ""), ("blocks", "blocks", "d"), ("hits", "hits", "d"),
                                        ("misses", "misses", "d"), ("agent read s/fetch", "mean_fetch_s", ".6f"),
                                        ("corrupt", "corrupt", "d")])
    for key, value in report.get("summary", {}).items():
        print(f"{key}: {'-' if value is None else format(value, '.3f')}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = measure_on_a_fleet(args, "fleet-kv-tiers-bench-", measure, start=start_fleet)
    write_json(args.out, report)
    print_report(report)


if __name__ == "__main__":
    main()
