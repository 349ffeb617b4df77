"""Routing benchmark: our gateway vs sglang-router and vllm-router (cache_aware) vs round-robin.

    .venv/bin/python benchmarks/routing.py [--quick] [--model smollm2|tiny] [--policies gateway,sglang,vllm,round_robin]
                                           [--rounds 1] [--duration 90] [--num-requests 80] [--slice-start 3910]

One set of reference engines (4 x `python -m engine.reference`, KV events on, one torch thread each) serves a
time-scaled slice of ../shared/traces/mooncake_synthetic.jsonl through each router in turn, with every
engine's prefix cache reset (POST /reset_prefix_cache) before each run; nothing else is restarted.

Workload: requests [slice_start, slice_start + N) of the trace. Each 512-token trace block (hash id) becomes
`--block-tokens` real token ids (16: one engine block), drawn from single-token lowercase words of the
SmolLM2 vocabulary by an RNG seeded with the hash id, so equal ids give equal token blocks. Prompt length =
ceil(input_length x B / 512) capped at `--max-prompt-tokens`; output = min(output_length,
`--max-output-tokens`) with ignore_eos; arrivals = trace timestamps stretched so the slice lasts
`--duration` seconds. Prompts are sent as TEXT (/v1/completions, stream, temperature 0): sglang-router
refuses token-id prompts (422), and the text is checked to tokenise back to exactly the intended ids.

Per run: client-side TTFT (request sent -> first token chunk) P50/P90, end-to-end time, throughput;
prefix-cache hit rate = sum of the engines' vllm:prefix_cache_hits_total deltas / queries deltas; requests
per engine from vllm:request_success_total deltas (busiest engine's share / mean share); the engines' own
mean TTFT (vllm:time_to_first_token_seconds deltas) and, as `beyond_engine_ttft_s`, how much longer the client
waited on average: the router's hop plus the client's own HTTP, which tells a router's routing (what the
engines saw) from its cost as a proxy. Per slice: the
oracle ceiling (infinite cache, perfect routing): the fraction of prompt tokens in leading 16-token blocks
already seen in an earlier request, looking up at most (n - 1) // 16 blocks as the engine does.
Then the latency the gateway adds: the same small streamed request through the gateway and directly to the
engine the gateway chose (x-fleet-served-by), interleaved, many trials; p50 of the paired differences, and
the gateway's own fleet_gateway_added_latency_seconds over those trials. Measured behind one engine (the goal's
figure) and behind `--engines` engines (`--latency-engines 1,4`): with several idle engines a router spreads
the identical requests over them, so the routed call meets an engine idle for a few requests while the direct
call goes to the one just used; on this machine a briefly idle engine answers ~1 ms slower (its process and
caches go cold), which the several-engine figure counts against the router. Behind one engine both calls
meet the same engine equally warm, so the difference is the hop and the router's own work.

Shapes and testbeds. `--shape agent|rag|system_prompt|no_sharing` replays a generated workload
(benchmarks/workloads: multi-turn agent sessions, RAG with varying document order, shared system prompts, no
sharing; `--seed`) at its own timing instead of the trace slice. `--testbed independent` runs 2 engines, each
pinned to its own CPU with one torch thread, so that, like GPU replicas, one engine's work does not slow the
other's; `shared` (the default) runs `--engines` engines over every CPU. The gateway is told which
(`--engines-share-hardware` on the shared testbed, `--engines-own-hardware` on the independent one), as an
operator would; a variant `gateway+--engines-own-hardware` overrides it.

Routers: the gateway; sglang-router and vllm-router (cache_aware, the flags of peer-routers.md) and
sglang-router's round_robin (`sglang_rr`), each a proxy in front of the engines like the gateway; and
`round_robin`, the client itself sending straight to the engines (no proxy hop: a bound, not a peer).
Each run also reports the router process's CPU per request (it competes with the engines for the cores).

Results: stdout and benchmarks/results/routing.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    RESULTS,
    BlockText,
    Proc,
    Procs,
    histogram_quantile,
    load_mooncake,
    log,
    metric_sum,
    peer_versions,
    percentile,
    print_table,
    reference_tokenizer_dir,
    reset_and_wait,
    rounded,
    scrape,
    start_engines,
    start_gateway,
    reset_caches,
    start_peer_router,
    wait_idle,
    write_json,
)
from benchmarks.routing_tail import Decision, tail_causes  # noqa: E402
from benchmarks.workloads import SHAPES, shapes  # noqa: E402
from engine.contract import REFERENCE_MODELS  # noqa: E402

OUT = RESULTS / "routing.json"
TRACE = "mooncake_synthetic.jsonl"
ENGINE_BLOCK = 16
# the peer routers (started from .peers/, the gateway's yardstick): name -> (router, its --policy)
PEER_ROUTERS = {"sglang": ("sglang", "cache_aware"), "vllm": ("vllm", "cache_aware"),
                "sglang_rr": ("sglang", "round_robin")}
PEERS = tuple(PEER_ROUTERS)
POLICIES = ("gateway", *PEERS, "round_robin")  # round_robin: the client itself, straight to the engines
# what the gateway is told about the testbed's hardware (gateway serve --engines-share-hardware)
TOPOLOGY_FLAG = {"shared": "--engines-share-hardware", "independent": "--engines-own-hardware"}
GOALS = {"p90_ttft_vs_best_peer": 0.8, "hit_rate_vs_oracle": 0.9, "busiest_vs_mean_share": 1.5, "added_latency_p50_ms": 2.0}


@dataclass(frozen=True)
class Req:
    index: int  # row in the trace
    arrival_s: float  # after the run starts
    ids: list[int]
    prompt: str | list[int]  # what is sent: the text (every router takes it), or the ids
    max_tokens: int


@dataclass
class Result:
    index: int
    status: int = 0
    error: str | None = None
    sent_at: float = 0.0  # seconds after the run started
    lag_s: float = 0.0  # sent - scheduled arrival
    ttft_s: float = math.nan
    e2e_s: float = math.nan
    chunks: int = 0  # content chunks received (one per token on the reference engine)
    served_by: str = ""  # the gateway's x-fleet-served-by engine
    explain: list[dict[str, Any]] | None = None  # --explain: the gateway's ranked candidates just before sending


# --- workload ---------------------------------------------------------------------------------------------


def workload_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The Mooncake-schema rows to replay: the trace slice, or a generated shape (benchmarks/workloads)."""
    if args.shape == "trace":
        return load_mooncake(TRACE)[args.slice_start : args.slice_start + args.num_requests]
    return shapes()[args.shape](seed=args.seed)


def build_workload(args: argparse.Namespace, blocks: BlockText) -> list[Req]:
    rows = workload_rows(args)
    t0, span = rows[0]["timestamp"], max(1, rows[-1]["timestamp"] - rows[0]["timestamp"])
    stretch = args.duration / (span / 1000.0) if args.duration else 1.0  # a shape keeps its own timing
    workload, mismatches = [], 0
    for offset, row in enumerate(rows):
        num_tokens = min(args.max_prompt_tokens, math.ceil(row["input_length"] * args.block_tokens / 512))
        ids = blocks.prompt_ids(row["hash_ids"], num_tokens)
        text = blocks.text(ids)
        if blocks.encode(text) != ids:
            mismatches += 1
        arrival = (row["timestamp"] - t0) / 1000.0 * stretch
        workload.append(Req((args.slice_start if args.shape == "trace" else 0) + offset, arrival, ids, text, max(1, min(args.max_output_tokens, row["output_length"]))))
    if mismatches:
        raise SystemExit(f"{mismatches} prompts do not tokenise back to their ids; the prefix structure would be off")
    return workload


def oracle_hits(workload: list[Req], block: int = ENGINE_BLOCK) -> list[int]:
    """Per request, the prompt tokens in leading blocks an earlier request already had (infinite cache,
    perfect routing)."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for req in workload:
        n, hits = len(req.ids), 0
        for b in range((n - 1) // block):  # the engine computes at least the last token
            if tuple(req.ids[: (b + 1) * block]) not in seen:
                break
            hits += block
        seen.update(tuple(req.ids[: (b + 1) * block]) for b in range(n // block))
        out.append(hits)
    return out


def oracle_ceiling(workload: list[Req], block: int = ENGINE_BLOCK) -> float:
    """Infinite cache, perfect routing: prompt tokens in leading blocks already seen, / prompt tokens."""
    total = sum(len(req.ids) for req in workload)
    return sum(oracle_hits(workload, block)) / total if total else math.nan


def workload_summary(workload: list[Req]) -> dict[str, Any]:
    lengths = [len(r.ids) for r in workload]
    return {
        "requests": len(workload),
        "duration_s": workload[-1].arrival_s,
        "prompt_tokens": sum(lengths),
        "prompt_tokens_mean": sum(lengths) / len(lengths),
        "prompt_tokens_max": max(lengths),
        "output_tokens": sum(r.max_tokens for r in workload),
        "distinct_first_blocks": len({tuple(r.ids[:ENGINE_BLOCK]) for r in workload}),
        "oracle_hit_rate": oracle_ceiling(workload),
    }


# --- the client -------------------------------------------------------------------------------------------


async def replay(workload: list[Req], target: Any, model: str, explain: bool = False) -> tuple[list[Result], float]:
    """Send every request at its arrival time (open loop); target(i) -> base URL. Returns results, makespan.
    `explain` (gateway only): ask POST /fleet/route/explain for the same body first and keep its ranking."""
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600.0, connect=10.0)) as client:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.2
        results = await asyncio.gather(*(one(client, req, target(i), model, start, explain) for i, req in enumerate(workload)))
        return list(results), loop.time() - start


async def one(client: httpx.AsyncClient, req: Req, base: str, model: str, start: float, explain: bool = False) -> Result:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start + req.arrival_s - loop.time()))
    sent = loop.time()
    result = Result(req.index, sent_at=sent - start, lag_s=sent - start - req.arrival_s)
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    try:
        if explain:
            answer = (await client.post(base + "/fleet/route/explain", json=body)).json()
            result.explain = [{k: c.get(k) for k in ("engine", "cached_blocks", "predicted_prefill_s", "recent_share",
                                                     "hot_spot_damped", "score", "num_waiting", "num_running",
                                                     "queued_prefill_tokens")} for c in answer["candidates"]]
        async with client.stream("POST", base + "/v1/completions", json=body) as response:
            result.status = response.status_code
            result.served_by = response.headers.get("x-fleet-served-by", " ").split(" ")[-1]
            if response.status_code != 200:
                result.error = (await response.aread()).decode(errors="replace")[:300]
                return result
            async for line in response.aiter_lines():
                if line.startswith(": x-fleet-served-by "):  # the engine, named late (first token after a keep-alive)
                    result.served_by = line.split(" ")[-1]
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result.error = json.dumps(chunk["error"])[:300]
                    continue
                if chunk.get("choices"):
                    if result.chunks == 0:
                        result.ttft_s = loop.time() - sent
                    result.chunks += 1
        result.e2e_s = loop.time() - sent
    except (httpx.HTTPError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    return result


def diagnose(workload: list[Req], results: list[Result], block: int = ENGINE_BLOCK) -> dict[str, Any]:
    """Where the gateway's prompt tokens that the oracle would have hit went (needs --explain): per request,
    the leading blocks an earlier request had (oracle), the most any engine held in the gateway's prefix index
    at decision time, and what the engine it chose held."""
    seen: set[tuple[int, ...]] = set()
    tokens = {"oracle": 0, "served_engine_held": 0, "index_did_not_know": 0, "passed_over_hot_spot": 0, "passed_over_load": 0}
    counts = {"requests_with_oracle_hits": 0, "followed_longest": 0, "index_did_not_know": 0, "passed_over": 0}
    for req, result in zip(workload, results):
        n = len(req.ids)
        oracle = 0
        for b in range((n - 1) // block):
            if tuple(req.ids[: (b + 1) * block]) not in seen:
                break
            oracle += 1
        seen.update(tuple(req.ids[: (b + 1) * block]) for b in range(n // block))
        if not oracle or not result.explain:
            continue
        counts["requests_with_oracle_hits"] += 1
        best = max(result.explain, key=lambda c: c["cached_blocks"])
        served = next((c for c in result.explain if c["engine"] == result.served_by), result.explain[0])
        known = min(best["cached_blocks"], oracle)
        got = min(served["cached_blocks"], oracle)
        tokens["oracle"] += oracle * block
        tokens["served_engine_held"] += got * block
        tokens["index_did_not_know"] += (oracle - known) * block
        if known > got:
            counts["passed_over"] += 1
            key = "passed_over_hot_spot" if best["hot_spot_damped"] else "passed_over_load"
            tokens[key] += (known - got) * block
        elif known < oracle:
            counts["index_did_not_know"] += 1
        else:
            counts["followed_longest"] += 1
    return {"tokens": tokens, "requests": counts}


def tail_report(workload: list[Req], results: list[Result], p90_s: float) -> dict[str, Any]:
    """benchmarks/routing_tail.py over the run: the cause of each request at or above the P90 TTFT."""
    decisions = [Decision(req.ids, r.ttft_s, r.served_by, r.explain or [], ENGINE_BLOCK)
                 for req, r in zip(workload, results)]
    report = tail_causes(decisions, p90_s)
    return {"p90_s": report.p90_s, "requests": report.requests, "causes": report.causes,
            "ttft_by_cause": report.ttft_by_cause, "examples": report.examples}


# --- engines ----------------------------------------------------------------------------------------------

ENGINE_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:request_success_total",
                   "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
                   "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count")


def engine_counters(engines: list[Proc]) -> list[dict[str, float]]:
    return [{name: metric_sum(samples, name) for name in ENGINE_COUNTERS} for samples in (scrape(e.url) for e in engines)]


def warm_up(engines: list[Proc], model: str, blocks: BlockText) -> None:
    """A few requests per engine so first-call costs (allocator, kernels) stay out of the measured runs."""
    for engine in engines:
        for n in (64, 256, 512):
            ids = blocks.prompt_ids(range(10**9, 10**9 + n // ENGINE_BLOCK + 1), n)
            httpx.post(engine.url + "/v1/completions", timeout=600,
                       json={"model": model, "prompt": ids, "max_tokens": 4, "ignore_eos": True}).raise_for_status()


def isolated_floor(engines: list[Proc], model: str, blocks: BlockText, workload: list[Req], trials: int = 3) -> dict[str, Any]:
    """What no router can beat on this slice: every request alone on an idle engine with the oracle's cache.
    Measured on one idle engine: TTFT (client-side, streamed, as in the runs) of a cold prompt of the
    slice's longest length and of the same prompt again (cached); a request with u uncached prompt tokens is
    priced by the line through those two points. Engines here share the machine's cores, so requests that
    overlap in time slow each other: the real floor is higher than this one."""
    engine, longest = engines[0], max(len(r.ids) for r in workload)
    reset_and_wait(engines)
    cold, cached = [], []
    for trial in range(trials):
        ids = blocks.prompt_ids(range(3 * 10**9 + 1000 * trial, 3 * 10**9 + 1000 * trial + longest // ENGINE_BLOCK + 1), longest)
        for times in (cold, cached):
            body = {"model": model, "prompt": ids, "max_tokens": 1, "stream": True}
            start = time.perf_counter()
            with httpx.stream("POST", engine.url + "/v1/completions", json=body, timeout=600) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        times.append(time.perf_counter() - start)
                        break
    reset_and_wait(engines)
    t_cold, t_cached = statistics.median(cold), statistics.median(cached)
    min_new = (longest - 1) % ENGINE_BLOCK + 1  # what a full hit still computes (the engine looks up (n - 1) // block blocks)
    per_token = (t_cold - t_cached) / max(1, longest - min_new)
    floors = [t_cached + per_token * max(0, len(r.ids) - hit - min_new) for r, hit in zip(workload, oracle_hits(workload))]
    return {"prompt_tokens": longest, "cold_ttft_s": t_cold, "cached_ttft_s": t_cached,
            "ttft_p50_s": percentile(floors, 50), "ttft_p90_s": percentile(floors, 90)}


# --- one run ----------------------------------------------------------------------------------------------


def split_policy(policy: str) -> tuple[str, list[str]]:
    """`gateway+--hot-spot-factor=1.2+--engines-share-hardware` -> ("gateway", [the flags]): a gateway variant,
    run beside the default gateway and the peers in the same run, so candidates share the run's machine state."""
    base, *flags = policy.split("+")
    if flags and base != "gateway":
        raise ValueError(f"{policy}: only the gateway takes extra flags")
    if base not in POLICIES:
        raise ValueError(f"{policy}: unknown policy; known: {', '.join(POLICIES)}")
    return base, flags


def run_policy(policy: str, procs: Procs, engines: list[Proc], workload: list[Req], model: str,
               gateway_flags: list[str], explain: bool = False) -> dict[str, Any]:
    router: Proc | None = None
    base, variant_flags = split_policy(policy)
    is_gateway = base == "gateway"
    if is_gateway:
        router = start_gateway(procs, engines, [*gateway_flags, *variant_flags])
        router.extra["model_name"] = model
        warm_router(router, model)
    elif base in PEERS:
        kind, peer_policy = PEER_ROUTERS[base]
        router = start_peer_router(procs, kind, engines, peer_policy)
    try:
        wait_idle(engines)
        reset_caches(engines)
        time.sleep(2.0)  # the gateway's index applies AllBlocksCleared; its probes see idle engines
        gateway_before = scrape(router.url) if is_gateway else None
        before = engine_counters(engines)
        urls = [e.url for e in engines]
        target = (lambda i: urls[i % len(urls)]) if router is None else (lambda i: router.url)
        log(f"run {policy}: {len(workload)} requests over {workload[-1].arrival_s:.0f}s")
        load_before = os.getloadavg()[0]
        cpu_before = cpu_seconds(router)
        results, makespan = asyncio.run(replay(workload, target, model, explain and is_gateway))
        cpu_after = cpu_seconds(router)
        load_after = os.getloadavg()[0]
        wait_idle(engines)
        after = engine_counters(engines)
        summary = summarise(policy, results, makespan, before, after, workload)
        summary["loadavg_1m"] = [load_before, load_after]  # the machine is shared: other jobs' load, for the reader
        # the router's own CPU per request: on this testbed it competes with the engines for the same cores
        summary["router_cpu_ms_per_request"] = (cpu_after - cpu_before) * 1000 / len(workload) if router else 0.0
        if is_gateway:
            summary["gateway"] = gateway_counters(gateway_before, scrape(router.url))
            if explain:
                summary["diagnosis"] = diagnose(workload, results)
                summary["tail"] = tail_report(workload, results, summary["ttft_p90_s"])
        return summary
    finally:
        if router is not None:
            procs.stop(router)


def cpu_seconds(router: Proc | None) -> float:
    """User + system CPU seconds of the router process and its children so far (0 without a router)."""
    if router is None:
        return 0.0
    total = 0.0
    try:
        process = psutil.Process(router.pid)
        for p in [process, *process.children(recursive=True)]:
            times = p.cpu_times()
            total += times.user + times.system
    except psutil.NoSuchProcess:
        pass
    return total


def warm_router(router: Proc, model: str) -> None:
    """The gateway loads its tokenizer on the first request: keep that out of the measured run."""
    for _ in range(3):
        httpx.post(router.url + "/v1/completions", timeout=120,
                   json={"model": model, "prompt": "warm up", "max_tokens": 1}).raise_for_status()


def summarise(policy: str, results: list[Result], makespan: float, before: list[dict[str, float]],
              after: list[dict[str, float]], workload: list[Req]) -> dict[str, Any]:
    delta = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before)]
    ok = [r for r in results if r.status == 200 and r.error is None and not math.isnan(r.ttft_s)]
    ok_ids = {id(r) for r in ok}
    failed = [r for r in results if id(r) not in ok_ids]
    ttfts = [r.ttft_s for r in ok]
    per_engine = [d["vllm:request_success_total"] for d in delta]
    total_requests = sum(per_engine)
    queries = sum(d["vllm:prefix_cache_queries_total"] for d in delta)
    hits = sum(d["vllm:prefix_cache_hits_total"] for d in delta)
    busiest = max(per_engine) / total_requests if total_requests else math.nan
    ttft_mean = sum(ttfts) / len(ttfts) if ttfts else math.nan
    engine_ttft_count = sum(d["vllm:time_to_first_token_seconds_count"] for d in delta)
    engine_ttft_mean = (sum(d["vllm:time_to_first_token_seconds_sum"] for d in delta) / engine_ttft_count
                        if engine_ttft_count else math.nan)
    return {
        "policy": policy,
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_samples": [f"{r.status} {r.error}" for r in failed][:3],
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
        "ttft_p99_s": percentile(ttfts, 99),
        "ttft_mean_s": ttft_mean,
        "engine_ttft_mean_s": engine_ttft_mean,  # the engines' own, from arrival there (a warm counts too)
        "beyond_engine_ttft_s": ttft_mean - engine_ttft_mean,  # the router's hop plus the client's HTTP
        "e2e_mean_s": sum(r.e2e_s for r in ok) / len(ok) if ok else math.nan,
        "e2e_p50_s": percentile([r.e2e_s for r in ok], 50),
        "e2e_p90_s": percentile([r.e2e_s for r in ok], 90),
        "makespan_s": makespan,
        "throughput_rps": len(ok) / makespan,
        "prompt_tokens_per_s": sum(len(workload[i].ids) for i, r in enumerate(results) if id(r) in ok_ids) / makespan,
        "output_tokens_per_s": sum(r.chunks for r in ok) / makespan,
        "output_tokens_mean": sum(r.chunks for r in ok) / len(ok) if ok else math.nan,
        "send_lag_p99_s": percentile([r.lag_s for r in results], 99),
        "hit_rate": hits / queries if queries else math.nan,
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "engine_requests": per_engine,
        "busiest_share": busiest,
        "busiest_vs_mean": busiest * len(per_engine) if total_requests else math.nan,
        "engine_prompt_tokens": sum(d["vllm:prompt_tokens_total"] for d in delta),
        "per_request": [{"row": r.index, "sent_s": round(r.sent_at, 3), "prompt_tokens": len(req.ids), "oracle_hit_tokens": hit,
                         "ttft_s": None if math.isnan(r.ttft_s) else round(r.ttft_s, 4), "served_by": r.served_by}
                        for r, req, hit in zip(results, workload, oracle_hits(workload))],
        "engine_generation_tokens": sum(d["vllm:generation_tokens_total"] for d in delta),
        "preemptions": sum(d["vllm:num_preemptions_total"] for d in delta),
    }


def gateway_counters(before: Any, after: Any) -> dict[str, Any]:
    def delta(name: str, **labels: str) -> float:
        return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)

    reasons = sorted({lab.get("reason", "") for lab, _ in after.get("fleet_gateway_routed_total", [])})
    outcomes = sorted({lab.get("outcome", "") for lab, _ in after.get("fleet_gateway_prefix_warms_total", [])})
    return {
        "routed_by_reason": {r: delta("fleet_gateway_routed_total", reason=r) for r in reasons},
        "warms_by_outcome": {o: delta("fleet_gateway_prefix_warms_total", outcome=o) for o in outcomes},
        "retries": delta("fleet_gateway_retries_total"),
        "admission_rejections": delta("fleet_gateway_admission_rejections_total"),
    }


# --- added latency ----------------------------------------------------------------------------------------


def added_latency(procs: Procs, args: argparse.Namespace, blocks: BlockText, num_engines: int) -> dict[str, Any]:
    """Streamed TTFT of one small request through the gateway vs directly to the engine it chose (interleaved,
    alternating which goes first), on `--latency-model` engines: `tiny` by default, whose ~10 ms answers keep
    the engine's own noise small next to a few milliseconds of gateway time. Both as a text prompt (the
    gateway tokenises it) and as token ids."""
    engines = start_engines(procs, num_engines, args.latency_model, 64, 2048, args.num_threads)
    model = httpx.get(engines[0].url + "/v1/models", timeout=10).json()["data"][0]["id"]
    gateway = start_gateway(procs, engines)  # the production setting: admission on
    try:
        warm_router(gateway, model)
        ids = blocks.prompt_ids(range(2 * 10**9, 2 * 10**9 + 4), 48)
        out: dict[str, Any] = {"engine_model": args.latency_model, "engines": len(engines), "trials": args.latency_trials,
                               "prompt_tokens": len(ids)}
        for label, prompt in (("text", blocks.text(ids)), ("token_ids", ids)):
            body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True}
            out[label] = paired_trials(gateway, engines, body, args.latency_trials)
        procs.stop(gateway)
        text_body = {"model": model, "prompt": blocks.text(ids), "max_tokens": 1, "temperature": 0, "stream": True}
        for engine in engines:
            engine.extra["model_name"] = model
        for peer in PEERS:  # the same measurement through each peer, for scale (text prompt)
            try:
                kind, peer_policy = PEER_ROUTERS[peer]
                router = start_peer_router(procs, kind, engines, peer_policy)
            except (RuntimeError, TimeoutError, OSError) as exc:  # OSError: the peer router is not installed
                out[f"{peer}_text"] = {"error": str(exc)[:300]}
                continue
            try:
                out[f"{peer}_text"] = paired_trials(router, engines, text_body, args.latency_trials)
            finally:
                procs.stop(router)
        return out
    finally:
        procs.stop(gateway)
        for engine in engines:
            procs.stop(engine)


def paired_trials(gateway: Proc, engines: list[Proc], body: dict[str, Any], trials: int) -> dict[str, Any]:
    """`gateway` may be a peer router: it names no engine, so the direct calls go to the engines in turn
    (identical, idle engines; the prompt is cached on all of them after the warm-up)."""
    by_name = {e.url.removeprefix("http://"): e.url for e in engines}
    for i, engine in enumerate(engines):
        by_name[f"#{i}"] = engine.url
    direct, through, diffs = [], [], []
    with httpx.Client(timeout=60) as client:
        for i in range(10):  # warm both paths, and the engine's cache for this prompt
            _, served = first_token(client, gateway.url, body)
            served = served or f"#{i % len(engines)}"
            first_token(client, by_name[served], body)
        before = scrape(gateway.url)
        for trial in range(trials):
            if trial % 2 == 0:
                t_gw, served = first_token(client, gateway.url, body)
                served = served or f"#{trial % len(engines)}"
                t_direct, _ = first_token(client, by_name[served], body)
            else:  # direct first, to the engine the gateway chose last time
                t_direct, _ = first_token(client, by_name[served], body)
                t_gw, served = first_token(client, gateway.url, body)
                served = served or f"#{trial % len(engines)}"
            direct.append(t_direct)
            through.append(t_gw)
            diffs.append(t_gw - t_direct)
        after = scrape(gateway.url)
    name = "fleet_gateway_added_latency_seconds"
    count = metric_sum(after, name + "_count") - metric_sum(before, name + "_count")  # 0 for a peer
    total = metric_sum(after, name + "_sum") - metric_sum(before, name + "_sum")
    buckets = {name + "_bucket": [(lab, v - metric_sum(before, name + "_bucket", **lab))
                                  for lab, v in after.get(name + "_bucket", [])]}
    return {
        "direct_ttft_p50_ms": 1000 * percentile(direct, 50),
        "gateway_ttft_p50_ms": 1000 * percentile(through, 50),
        "added_p50_ms": 1000 * percentile(diffs, 50),
        "added_p90_ms": 1000 * percentile(diffs, 90),
        "added_p50_of_p50s_ms": 1000 * (percentile(through, 50) - percentile(direct, 50)),
        "gateway_metric_mean_ms": 1000 * total / count if count else math.nan,
        "gateway_metric_p50_ms_bucketed": 1000 * histogram_quantile(buckets, name, 0.5),
        "gateway_metric_p90_ms_bucketed": 1000 * histogram_quantile(buckets, name, 0.9),
    }


def first_token(client: httpx.Client, base: str, body: dict[str, Any]) -> tuple[float, str]:
    """Seconds from send to the first token chunk of a stream; and the engine that served it (gateway only)."""
    start = time.perf_counter()
    with client.stream("POST", base + "/v1/completions", json=body) as response:
        response.raise_for_status()
        served = response.headers.get("x-fleet-served-by", " ").split(" ")[-1]  # "" for a peer router
        elapsed = math.nan
        for line in response.iter_lines():
            if line.startswith("data: {") and math.isnan(elapsed):
                elapsed = time.perf_counter() - start
        return elapsed, served


# --- main -------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 20 requests over 20 s, prompts <= 256 tokens, 40 latency trials")
    p.add_argument("--model", default="smollm2", choices=REFERENCE_MODELS)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--kv-cache-mib", type=int, default=256)
    p.add_argument("--num-threads", type=int, default=1, help="torch threads per engine")
    p.add_argument("--slice-start", type=int, default=3910, help="first trace row of the slice")
    p.add_argument("--num-requests", type=int, default=80)
    p.add_argument("--block-tokens", type=int, default=16, help="real tokens per 512-token trace block")
    p.add_argument("--max-prompt-tokens", type=int, default=512)
    p.add_argument("--max-output-tokens", type=int, default=16)
    p.add_argument("--duration", type=float, default=None,
                   help="seconds the arrivals are stretched over (default: 90 for the trace, a shape's own timing)")
    p.add_argument("--shape", default="trace", choices=("trace", *SHAPES),
                   help="the trace slice, or a generated prompt shape (benchmarks/workloads)")
    p.add_argument("--seed", type=int, default=0, help="a generated shape's seed")
    p.add_argument("--testbed", default="shared", choices=("shared", "independent"),
                   help="shared: --engines engines on every CPU; independent: 2 engines, each pinned to its own CPU")
    p.add_argument("--policies", default=",".join(POLICIES),
                   help="comma-separated, of " + ", ".join(POLICIES) + "; a gateway variant is gateway+FLAG[+FLAG], "
                        "e.g. gateway+--hot-spot-factor=1.2")
    p.add_argument("--rounds", type=int, default=1, help="repeat the policies, in reversed order every other round")
    p.add_argument("--latency-trials", type=int, default=300, help="paired trials per prompt form (0: skip)")
    p.add_argument("--latency-engines", default="1,4",
                   help="engines behind the router in the added-latency phase, one measurement each; the first is the goal's")
    p.add_argument("--latency-model", default="tiny", choices=REFERENCE_MODELS, help="engines of the added-latency phase")
    p.add_argument("--gateway-flag", action="append", default=[], help="extra `gateway serve` flag (repeatable)")
    p.add_argument("--explain", action="store_true",
                   help="diagnostic: ask the gateway's /fleet/route/explain before each request and account for "
                        "the oracle's hits it missed (adds a request per request: not for the main figures)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if args.quick:
        args.num_requests, args.duration, args.max_prompt_tokens, args.latency_trials = 20, 20.0, 256, 40
    if args.duration is None and args.shape == "trace":
        args.duration = 90.0
    if args.testbed == "independent":
        args.engines = 2
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for policy in policies:  # refuse a bad name before minutes of set-up
        try:
            split_policy(policy)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
    blocks = BlockText(reference_tokenizer_dir(), args.block_tokens)
    workload = build_workload(args, blocks)
    shape = workload_summary(workload)
    log(f"workload: {json.dumps(shape)}")
    runs: list[dict[str, Any]] = []
    peer_failures: dict[str, str] = {}
    gateway_flags = ["--no-admission", TOPOLOGY_FLAG[args.testbed], *args.gateway_flag]
    started = time.time()
    with Procs() as procs:
        engines = start_engines(procs, args.engines, args.model, args.kv_cache_mib, 2048, args.num_threads,
                                pinned=args.testbed == "independent")
        model = httpx.get(engines[0].url + "/v1/models", timeout=10).json()["data"][0]["id"]
        for engine in engines:
            engine.extra["model_name"] = model
        warm_up(engines, model, blocks)
        floor = isolated_floor(engines, model, blocks, workload)
        log(f"isolated floor: {json.dumps(rounded(floor))}")
        for round_no in range(args.rounds):
            order = policies if round_no % 2 == 0 else list(reversed(policies))
            for policy in order:
                if policy in peer_failures:
                    continue
                try:
                    summary = run_policy(policy, procs, engines, workload, model, gateway_flags, args.explain)
                except (RuntimeError, TimeoutError, OSError) as exc:  # OSError: the peer router is not installed
                    if policy not in PEERS:
                        raise
                    peer_failures[policy] = str(exc)[:2000]
                    log(f"{policy} could not run: {exc}")
                    continue
                summary["round"] = round_no
                runs.append(summary)
                log(f"{policy}: p50 {summary['ttft_p50_s']:.3f}s p90 {summary['ttft_p90_s']:.3f}s hit {summary['hit_rate']:.3f} "
                    f"busiest x{summary['busiest_vs_mean']:.2f} errors {summary['errors']}")
        for engine in engines:
            procs.stop(engine)
        latency: dict[str, Any] = {}
        if "gateway" in policies and args.latency_trials > 0:
            for num_engines in [int(n) for n in args.latency_engines.split(",") if n.strip()]:
                latency[str(num_engines)] = added_latency(procs, args, blocks, num_engines)
    shape["isolated_floor"] = floor
    report = build_report(args, shape, runs, latency, peer_failures, time.time() - started)
    write_json(args.out, report)
    print_report(report)


def aggregate(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per policy: the mean over rounds of each figure, and the spread (max - min) of P90 TTFT."""
    keys = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_mean_s", "engine_ttft_mean_s", "beyond_engine_ttft_s",
            "e2e_mean_s", "throughput_rps", "output_tokens_per_s", "hit_rate", "busiest_vs_mean", "busiest_share", "errors",
            "makespan_s", "router_cpu_ms_per_request")
    out: dict[str, dict[str, Any]] = {}
    for policy in dict.fromkeys(r["policy"] for r in runs):
        mine = [r for r in runs if r["policy"] == policy]
        row: dict[str, Any] = {"policy": policy, "rounds": len(mine)}
        for key in keys:
            row[key] = sum(r[key] for r in mine) / len(mine)
        p90s = [r["ttft_p90_s"] for r in mine]
        row["ttft_p90_spread_s"] = max(p90s) - min(p90s)
        out[policy] = row
    return out


# Where spreading load buys parallelism (independent engines), balance matters on these shapes: there the
# gateway should beat the best peer's tail by a margin, not just tie it.
BALANCE_SHAPES = ("agent", "system_prompt")
BALANCE_MARGIN = 0.8


def best_peer(table: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The peer router with the lowest mean P90 TTFT (None when no peer ran)."""
    peers = [table[p] for p in PEERS if p in table]
    return min(peers, key=lambda r: r["ttft_p90_s"]) if peers else None


def shape_goals(shape: str, testbed: str, table: dict[str, dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The tail goals of a generated shape: the gateway's P90 TTFT (mean over rounds) at most the best peer's
    (times BALANCE_MARGIN on the independent testbed for BALANCE_SHAPES); in no round worse than that round's
    best peer by more than the peers' own round-to-round spread; on RAG no worse than round robin (the lower
    of the client's and the proxy's). The peers are the proxies of PEERS; the client's round robin, which
    skips a proxy hop, is held against the gateway on RAG only."""
    ours, peers = table["gateway"], [table[p] for p in PEERS if p in table]
    best = best_peer(table)
    limit = BALANCE_MARGIN if testbed == "independent" and shape in BALANCE_SHAPES else 1.0
    ratio = ours["ttft_p90_s"] / best["ttft_p90_s"]
    goals: dict[str, Any] = {"p90_ttft_vs_best_peer": {"value": ratio, "best_peer": best["policy"], "goal": f"<= {limit}",
                                                       "met": ratio <= limit}}
    spread = max(r["ttft_p90_spread_s"] for r in peers)
    worst_excess = -math.inf
    for round_no in sorted({r["round"] for r in runs}):
        mine = {r["policy"]: r["ttft_p90_s"] for r in runs if r["round"] == round_no}
        round_peers = [mine[p] for p in PEERS if p in mine]
        if "gateway" in mine and round_peers:
            worst_excess = max(worst_excess, mine["gateway"] - min(round_peers))
    goals["worst_round_p90_excess_s"] = {"value": worst_excess, "goal": f"<= peers' spread {spread:.3f}",
                                         "met": worst_excess <= spread}
    round_robins = [table[p] for p in ("round_robin", "sglang_rr") if p in table]  # the client's or the proxy's
    if shape == "rag" and round_robins:
        vs_rr = ours["ttft_p90_s"] / min(r["ttft_p90_s"] for r in round_robins)
        goals["p90_ttft_vs_round_robin"] = {"value": vs_rr, "goal": "<= 1.0", "met": vs_rr <= 1.0}
    return goals


def busiest_share_goal(testbed: str, busiest_vs_mean: float) -> dict[str, Any] | None:
    """The hot-spot guard's bound on the busiest engine's share, held only where the engines have their own
    hardware: on the shared testbed the gateway is told they share it, which turns the guard off by design
    (a spill there buys no parallelism), so concentrating is not a failure."""
    if testbed != "independent":
        return None
    limit = GOALS["busiest_vs_mean_share"]
    return {"value": busiest_vs_mean, "goal": f"<= {limit}", "met": busiest_vs_mean <= limit}


def build_report(args: argparse.Namespace, shape: dict[str, Any], runs: list[dict[str, Any]], latency: dict[str, Any],
                 peer_failures: dict[str, str], wall_s: float) -> dict[str, Any]:
    table = aggregate(runs)
    oracle = shape["oracle_hit_rate"]
    for row in table.values():
        row["hit_vs_oracle"] = row["hit_rate"] / oracle if oracle else math.nan
    goals: dict[str, Any] = {}
    best = best_peer(table)
    if "gateway" in table:
        ours = table["gateway"]
        if best is not None and args.shape != "trace":
            goals.update(shape_goals(args.shape, args.testbed, table, runs))
        elif best is not None:
            ratio = ours["ttft_p90_s"] / best["ttft_p90_s"]
            goals["p90_ttft_vs_best_peer"] = {"value": ratio, "best_peer": best["policy"], "goal": f"<= {GOALS['p90_ttft_vs_best_peer']}",
                                              "met": ratio <= GOALS["p90_ttft_vs_best_peer"],
                                              "isolated_floor_vs_best_peer": shape["isolated_floor"]["ttft_p90_s"] / best["ttft_p90_s"]}
        goals["hit_rate_vs_oracle"] = {"value": ours["hit_vs_oracle"], "goal": f">= {GOALS['hit_rate_vs_oracle']}",
                                       "met": ours["hit_vs_oracle"] >= GOALS["hit_rate_vs_oracle"]}
        share_goal = busiest_share_goal(args.testbed, ours["busiest_vs_mean"])
        if share_goal is not None:
            goals["busiest_vs_mean_share"] = share_goal
    if latency:
        engines, primary = next(iter(latency.items()))  # the first of --latency-engines
        value = primary["text"]["added_p50_ms"]  # clients send text: the gateway tokenises
        goals["added_latency_p50_ms"] = {"value": value, "engines": int(engines), "goal": f"<= {GOALS['added_latency_p50_ms']}",
                                         "met": value <= GOALS["added_latency_p50_ms"]}
    return {
        "benchmark": "routing",
        "command": "benchmarks/routing.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": _cpus(), "python": platform.python_version(), "platform": platform.platform()},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "trace": {"file": TRACE, "slice": [args.slice_start, args.slice_start + args.num_requests]}
        if args.shape == "trace" else {"shape": args.shape, "seed": args.seed},
        "testbed": {"kind": args.testbed, "engines": args.engines, "pinned": args.testbed == "independent"},
        "workload": shape,
        "peer_versions": peer_versions(),
        "peer_failures": peer_failures,
        "summary": list(table.values()),
        "runs": runs,
        "added_latency": latency,  # by the number of engines behind the router
        "goals": goals,
        "wall_s": wall_s,
    }


def _cpus() -> int:
    return os.cpu_count() or 0


def print_report(report: dict[str, Any]) -> None:
    shape = report["workload"]
    source = f"slice rows {report['trace']['slice']}" if "slice" in report["trace"] else f"shape {report['trace']['shape']}"
    print(f"\n{source} on the {report['testbed']['kind']} testbed: {shape['requests']} requests over {shape['duration_s']:.0f}s, "
          f"prompt mean {shape['prompt_tokens_mean']:.0f} tokens, oracle hit rate {shape['oracle_hit_rate']:.3f}")
    floor = shape["isolated_floor"]
    print(f"isolated floor (each request alone on an idle engine, oracle cache): TTFT p50 {floor['ttft_p50_s']:.3f}s "
          f"p90 {floor['ttft_p90_s']:.3f}s (cold {floor['prompt_tokens']}-token prompt {floor['cold_ttft_s']:.3f}s, "
          f"cached {floor['cached_ttft_s']:.3f}s)")
    print_table(report["summary"], [
        ("policy", "policy", ""), ("rounds", "rounds", "d"), ("TTFT p50 s", "ttft_p50_s", ".3f"),
        ("TTFT p90 s", "ttft_p90_s", ".3f"), ("p90 spread", "ttft_p90_spread_s", ".3f"), ("TTFT p99 s", "ttft_p99_s", ".3f"),
        ("TTFT mean s", "ttft_mean_s", ".3f"), ("beyond engine s", "beyond_engine_ttft_s", ".3f"),
        ("e2e mean s", "e2e_mean_s", ".3f"), ("req/s", "throughput_rps", ".3f"),
        ("out tok/s", "output_tokens_per_s", ".1f"), ("hit rate", "hit_rate", ".3f"), ("hit/oracle", "hit_vs_oracle", ".2f"),
        ("busiest/mean", "busiest_vs_mean", ".2f"), ("router cpu ms/req", "router_cpu_ms_per_request", ".1f"),
        ("errors", "errors", ".0f"),
    ])
    for engines, lat in (report["added_latency"] or {}).items():
        behind = f"{engines} {lat['engine_model']} engine{'s' if engines != '1' else ''}"
        for form in ("text", "token_ids"):
            x = lat[form]
            print(f"added latency ({form} prompt, {lat['trials']} pairs, {behind}): p50 of paired differences "
                  f"{x['added_p50_ms']:.2f} ms (p90 {x['added_p90_ms']:.2f}); direct TTFT p50 {x['direct_ttft_p50_ms']:.2f} ms, "
                  f"via gateway {x['gateway_ttft_p50_ms']:.2f} ms; gateway's own metric mean {x['gateway_metric_mean_ms']:.2f} ms")
        for peer in [f"{p}_text" for p in PEERS]:
            x = lat.get(peer) or {}
            if "added_p50_ms" in x:
                print(f"added latency through {peer.split('_')[0]}-router (text prompt, same method, {behind}): p50 of paired "
                      f"differences {x['added_p50_ms']:.2f} ms (p90 {x['added_p90_ms']:.2f})")
    for run in report["runs"]:
        if "diagnosis" in run:
            print(f"diagnosis ({run['policy']}, round {run['round']}): {json.dumps(run['diagnosis'])}")
        if "tail" in run:
            causes = {c: n for c, n in run["tail"]["causes"].items() if n}
            print(f"tail ({run['policy']}, round {run['round']}): {run['tail']['requests']} requests at or above "
                  f"p90 {run['tail']['p90_s']:.3f}s, by cause {json.dumps(causes)}")
    for name, failure in report["peer_failures"].items():
        print(f"{name}: could not run: {failure.splitlines()[0]}")
    for goal, value in report["goals"].items():
        extra = f"; the isolated floor's p90 is {value['isolated_floor_vs_best_peer']:.3f} of it" if "isolated_floor_vs_best_peer" in value else ""
        print(f"goal {goal}: {value['value']:.3f} (goal {value['goal']}) {'MET' if value['met'] else 'NOT MET'}{extra}")


if __name__ == "__main__":
    main()
