"""Prefix routing to engines started with vLLM's default hash seed, with the gateway on the fleet's old default
seed ("0") and on the new one (vLLM's "vllm-none-hash"), in the same run.

    .venv/bin/python benchmarks/hash_seed.py [--model tiny] [--engines 4] [--groups 16] [--rounds 6] [--concurrency 4]

Engines: `--engines` reference engines started with `--hash-seed vllm-none-hash`, as a stock vLLM started with
`--prefix-caching-hash-algo sha256_cbor` and no PYTHONHASHSEED hashes. Before each phase the engines' prefix
caches are reset (POST /reset_prefix_cache). Per phase, a gateway in front of them (static table, KV events)
with `--hash-seed SEED`, and the same workload: `--groups` shared prefixes of `--prefix-blocks` blocks, each
asked `--rounds` times with a different suffix, the groups interleaved (a multi-turn pattern: the prefix is
cached somewhere after its first request), `--concurrency` requests in flight. Measured per phase:
- routed by prefix: the share of requests the gateway sent where its index said the prefix was
  (fleet_gateway_routed_total{reason="prefix"} over all routed);
- engine hit rate: prompt tokens the engines found in their caches over prompt tokens looked up
  (Σ vllm:prefix_cache_hits_total / Σ vllm:prefix_cache_queries_total deltas over the engines);
- the gateway's hash check: how many engines it flagged `hash_mismatch`.
The ceiling is the hit rate with every request of a group on the engine that served its first one.
Results: a table on stdout and benchmarks/results/hash_seed.json. Run it alone on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import platform
from concurrent.futures import ThreadPoolExecutor
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import Procs, log, metric_sum, print_table, scrape, start_engines, start_gateway, write_json  # noqa: E402
from engine.hashing import LEGACY_HASH_SEED, VLLM_DEFAULT_HASH_SEED  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "hash_seed.json"
BLOCK = 16


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("tiny", "smollm2"), default="tiny", help="the engines' weights")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--groups", type=int, default=16, help="shared prefixes")
    p.add_argument("--rounds", type=int, default=6, help="requests per prefix")
    p.add_argument("--prefix-blocks", type=int, default=8, help="blocks of 16 tokens in each shared prefix")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight (load routing spreads them)")
    p.add_argument("--out", type=Path, default=OUT)
    return p.parse_args(argv)


def workload(args: argparse.Namespace) -> list[list[int]]:
    """Token-id prompts: group g's prefix, then a suffix of its own per round; rounds interleave the groups."""
    prefix_len = args.prefix_blocks * BLOCK
    prompts = []
    for round_ in range(args.rounds):
        for group in range(args.groups):
            prefix = [1000 + 400 * group + i for i in range(prefix_len)]
            suffix = [20_000 + 100 * round_ + 10 * group + i for i in range(8)]
            prompts.append(prefix + suffix)
    return prompts


def engine_counters(engines: list[Any]) -> tuple[float, float]:
    hits = queries = 0.0
    for engine in engines:
        samples = scrape(engine.url)
        hits += metric_sum(samples, "vllm:prefix_cache_hits_total")
        queries += metric_sum(samples, "vllm:prefix_cache_queries_total")
    return hits, queries


def phase(procs: Procs, engines: list[Any], seed: str, prompts: list[list[int]], model: str,
          concurrency: int) -> dict[str, Any]:
    for engine in engines:
        httpx.post(engine.url + "/reset_prefix_cache", timeout=30).raise_for_status()
    gateway = start_gateway(procs, engines, ["--hash-seed", seed])
    try:
        time.sleep(2.0)  # the KV event subscriptions connect
        hits0, queries0 = engine_counters(engines)
        with httpx.Client(timeout=120) as client, ThreadPoolExecutor(concurrency) as pool:
            def send(prompt: list[int]) -> None:
                body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
                client.post(gateway.url + "/v1/completions", json=body).raise_for_status()

            list(pool.map(send, prompts))
        hits1, queries1 = engine_counters(engines)
        samples = scrape(gateway.url)
        routed = metric_sum(samples, "fleet_gateway_routed_total")
        by_prefix = metric_sum(samples, "fleet_gateway_routed_total", reason="prefix")
        flagged = metric_sum(samples, "fleet_gateway_engine_hash_mismatch")
    finally:
        procs.stop(gateway)
    return {"gateway_seed": seed, "requests": len(prompts), "routed_by_prefix": by_prefix / routed if routed else None,
            "engine_hit_rate": (hits1 - hits0) / (queries1 - queries0) if queries1 > queries0 else None,
            "engines_flagged": flagged}


def ceiling(args: argparse.Namespace) -> float:
    """Every request after a group's first finds the group's full prefix blocks cached (the suffix and the
    prompt's last partial block are computed)."""
    prompt_len = args.prefix_blocks * BLOCK + 8
    cached = (args.rounds - 1) * args.groups * args.prefix_blocks * BLOCK
    return cached / (args.rounds * args.groups * prompt_len)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    prompts = workload(args)
    model = "tiny" if args.model == "tiny" else "smollm2-135m"
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with Procs() as procs:
        engines = start_engines(procs, args.engines, args.model, 64, 2048,
                                extra=["--hash-seed", VLLM_DEFAULT_HASH_SEED])
        rows = [phase(procs, engines, seed, prompts, model, args.concurrency)
                for seed in (LEGACY_HASH_SEED, VLLM_DEFAULT_HASH_SEED)]
    for row, label in zip(rows, ("before: gateway on the old default", "after: gateway on vLLM's default")):
        row["phase"] = label
    print_table(rows, [("phase", "phase", ""), ("gateway seed", "gateway_seed", ""),
                       ("routed by prefix", "routed_by_prefix", ".2f"), ("engine hit rate", "engine_hit_rate", ".3f"),
                       ("engines flagged", "engines_flagged", ".0f")])
    report = {"benchmark": "hash_seed", "command": "benchmarks/hash_seed.py " + " ".join(sys.argv[1:]),
              "started": started, "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "machine": {"platform": platform.platform()}, "engine_seed": VLLM_DEFAULT_HASH_SEED,
              "ceiling_hit_rate": ceiling(args), "phases": rows}
    log(f"ceiling hit rate {report['ceiling_hit_rate']:.3f}")
    write_json(args.out, report)


if __name__ == "__main__":
    main()
