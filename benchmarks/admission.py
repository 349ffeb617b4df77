"""Admission benchmark: predictive admission vs rejection on observed load, at 2x the Azure rate.

    .venv/bin/python benchmarks/admission.py [--quick] [--rate 2] [--minutes 10] [--slices 0,1200,2400]
        [--scenarios 1.25:1.25,1.25:1.0,1.5:1.5] [--ttft-slo-s 5] [--calibrate] [--live]

A SIMULATION, `fleetctl.sim`, driven by the same pure functions the gateway calls: every arrival builds a
`fleetctl.gateway.admission.ModelLoadSnapshot` of the simulated fleet and asks `admit_on_predicted_load`
(ours; `ModelSLO(ttft_slo_s)`) or `admit_on_observed_load` (the baseline; `ObservedLoadThresholds`)
whether to admit, and where to. A run that admits everything (`none`) gives the scale. Both policies are
also run at other settings (the predictor's limit as a fraction of the SLO; the baseline's max_waiting), so
each can be compared at its default AND at its best. This file is the driver: workload, fleet sizes,
policies and figures; the model (discrete events, exact times) is described in `fleetctl.sim`'s modules.

- requests (`fleetctl.sim.workload.trace_slice`): ../shared/traces/azure_llm_2023_conv.csv, `--minutes`
  of trace time from each of `--slices`, arrivals compressed `--rate` times (2: twice the rate); prompt =
  ContextTokens / `--prompt-scale` (8), output = GeneratedTokens / `--output-scale` (4), scaled so the
  reference engine's constants give a fleet of a few engines; max_tokens = the output length
  (`--max-tokens-factor` makes clients ask for more). A rejected request is lost (no retry).
- P/D fleet (`fleetctl.sim.engines`): FIFO prefill engines at `prefill_tokens_per_s`; decode engines with a
  continuous batch of at most `--max-num-seqs`, a step taking `decode_step_base_s + decode_step_per_seq_s x
  batch`, a KV pool of `--kv-cache-mib` of SmolLM2 float32 KV with vLLM's recompute preemption. TTFT =
  arrival -> the end of the request's first decode step.
- engine constants: measured on the reference engine (SmolLM2-135M, one torch thread; `--calibrate`
  re-measures them in-process) and recorded in the JSON. Per scenario PREFILL:DECODE and slice, the fleet
  is sized (`fleetctl.sim.sizing`) so the slice's mean offered prefill and decode work at `--rate` is that
  many times its capacity.
- routing: the predictor's chosen pair when it admits; for the baseline and `none`, the shortest prefill
  queue and the least loaded decode engine (among those the baseline finds free).

Figures per policy: rejected requests, goodput (requests whose TTFT met the SLO, per second of the slice),
TTFT P50/P90 of admitted requests, and the swing of the prefill queue (requests waiting or in prefill,
fleet-wide), the decode queue (prefilled or preempted, waiting) and the decode batch (running), sampled
every simulated second after `--warmup-s`: std dev and max - min. `--live`: a short run of the real
gateway (admission on vs `--no-admission`) over 2 tiny engines, to show the same predictor refusing live.

Results: stdout and benchmarks/results/admission.json.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, load_azure, log, percentile, print_table, stdev, write_json  # noqa: E402
from engine.contract import REFERENCE_MODELS  # noqa: E402
from fleetctl.gateway.admission import ModelSLO, ObservedLoadThresholds  # noqa: E402
from fleetctl.sim import (  # noqa: E402
    REFERENCE_SMOLLM2_CPU,
    EngineConstants,
    FleetShape,
    LengthScaling,
    Outcome,
    Policy,
    SimResult,
    TraceRow,
    admit_all_policy,
    load_azure_trace,
    observed_policy,
    predicted_policy,
    simulate,
    size_for_overload,
    trace_slice,
)
from fleetctl.sim.workload import TRACES_DIR  # noqa: E402

OUT = RESULTS / "admission.json"
TRACE = "azure_llm_2023_conv.csv"
DEFAULT_CONSTANTS = REFERENCE_SMOLLM2_CPU  # see fleetctl.sim.engines for how they were measured
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 4  # SmolLM2-135M, float32: layers x (K, V) x kv heads x head dim x bytes


# --- figures of one run ----------------------------------------------------------------------------------


def measure(result: SimResult, slo_s: float, duration_s: float, warmup_s: float) -> dict[str, Any]:
    """The benchmark's figures of one run: rejections, goodput, TTFT percentiles, queue swings."""
    failed = result.with_outcome(Outcome.FAILED)
    assert not failed, f"no horizon and no context window: nothing can fail, yet {failed[0]}"
    admitted = [r for r in result.requests if r.admitted]
    ttfts = [r.ttft_s for r in admitted if r.ttft_s is not None]
    good = [t for t in ttfts if t <= slo_s]
    steady = [s for s in result.samples if s.t_s >= warmup_s] or list(result.samples)  # leave the empty-fleet ramp out
    prefill_q, decode_q, decode_run = ([s.prefill_queue for s in steady], [s.decode_queue for s in steady],
                                       [s.decode_running for s in steady])
    admitted_per_s = result.admitted_per_second()
    admits = [admitted_per_s.get(k, 0) for k in range(int(warmup_s), int(duration_s))] or [0]

    def swing(values: list[int]) -> dict[str, float]:
        return {"mean": sum(values) / len(values), "std": stdev(values), "max_minus_min": max(values) - min(values),
                "max": max(values)}

    return {
        "requests": len(result.requests),
        "rejected": len(result.requests) - len(admitted),
        "admitted": len(admitted),
        "goodput_rps": len(good) / duration_s,
        "within_slo": len(good),
        "admitted_missing_slo": len(admitted) - len(good),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
        "ttft_p99_s": percentile(ttfts, 99),
        "prefill_queue": swing(prefill_q),
        "decode_queue": swing(decode_q),
        "decode_running": swing(decode_run),
        "admitted_per_s": swing(admits),
        "last_finish_s": max((r.finished_s or 0.0) for r in admitted) if admitted else 0.0,
        "series": {"t": [s.t_s for s in result.samples], "prefill_queue": [s.prefill_queue for s in result.samples],
                   "decode_queue": [s.decode_queue for s in result.samples],
                   "decode_running": [s.decode_running for s in result.samples]},
        "preemptions": result.preemptions,
    }


# --- calibration ------------------------------------------------------------------------------------------


def calibrate(threads: int) -> EngineConstants:
    """Prefill throughput and decode step time of the reference engine (SmolLM2-135M), in-process."""
    import random

    import torch

    from engine.reference.config import EngineConfig
    from engine.reference.llm_engine import LLMEngine
    from engine.contract.sampling_params import SamplingParams

    torch.set_num_threads(threads)
    engine = LLMEngine(EngineConfig(model="smollm2", kv_cache_mib=512, max_num_seqs=64, max_num_batched_tokens=512,
                                    max_model_len=2048, num_threads=threads))
    rng = random.Random(0)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(100, 49000) for _ in range(n)]

    def run(batch: list[tuple[list[int], int]]) -> list[float]:
        step_times, ids = [], []
        for prompt_ids, out in batch:
            ids.append(f"c{rng.random()}")
            engine.add_request(ids[-1], prompt_ids, SamplingParams(max_tokens=out, temperature=0.0, ignore_eos=True))
        while engine.has_work():
            start = time.perf_counter()
            engine.step()
            step_times.append(time.perf_counter() - start)
        return step_times

    run([(prompt(64), 4)])  # warm-up
    prefill = []
    for _ in range(3):
        start = time.perf_counter()
        run([(prompt(1024), 1)])
        prefill.append(1024 / (time.perf_counter() - start))
    steps = {}
    for batch in (1, 16, 48):
        times = run([(prompt(64), 24) for _ in range(batch)])
        steps[batch] = percentile(times[-16:], 50)  # decode-only steps at the end
    per_seq = (steps[48] - steps[1]) / 47
    return EngineConstants(percentile(prefill, 50), max(1e-4, steps[1] - per_seq), max(0.0, per_seq),
                           f"--calibrate ({threads} thread(s)): prefill runs {[round(x) for x in prefill]} tok/s, "
                           f"median step s at batch {steps}")


# --- main -------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 2 minutes of one slice, one scenario")
    p.add_argument("--rate", type=float, default=2.0, help="arrival-rate multiplier")
    p.add_argument("--minutes", type=float, default=10.0, help="minutes of trace time per slice")
    p.add_argument("--slices", default="0,1200,2400", help="trace start times (s) of the slices")
    p.add_argument("--scenarios", default="1.25:1.25,1.25:1.0,1.5:1.5",
                   help="PREFILL:DECODE offered work / capacity at --rate; the first is the main one")
    p.add_argument("--warmup-s", type=float, default=30.0, help="simulated seconds left out of the queue statistics")
    p.add_argument("--prompt-scale", type=float, default=8.0, help="prompt tokens = ContextTokens / this")
    p.add_argument("--output-scale", type=float, default=4.0, help="output tokens = GeneratedTokens / this")
    p.add_argument("--ttft-slo-s", type=float, default=5.0, help="the TTFT SLO of goodput")
    p.add_argument("--predictor-limits", default="1.0,0.8,0.6",
                   help="the predictor's --ttft-slo-s as fractions of the SLO (1.0 = the gateway as configured)")
    p.add_argument("--max-waiting", default="8,4,2,1",
                   help="the baseline's max_waiting (the first = ObservedLoadThresholds' default 8)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="decode slots per decode engine")
    p.add_argument("--kv-cache-mib", type=int, default=512, help="KV pool per decode engine (SmolLM2 float32 tokens)")
    p.add_argument("--max-tokens-factor", type=float, default=1.0, help="requests ask max_tokens = factor x output")
    p.add_argument("--prefill-tokens-per-s", type=float, help="override the calibrated constant")
    p.add_argument("--decode-step-base-s", type=float, help="override the calibrated constant")
    p.add_argument("--decode-step-per-seq-s", type=float, help="override the calibrated constant")
    p.add_argument("--calibrate", action="store_true", help="measure the engine constants now (SmolLM2, in-process)")
    p.add_argument("--calibrate-threads", type=int, default=1)
    p.add_argument("--live", action="store_true", help="also a short live sanity run through the real gateway")
    p.add_argument("--live-only", action="store_true", help="run only the live part; store it into the existing --out")
    p.add_argument("--live-seconds", type=float, default=45.0, help="live run: seconds of arrivals (trace time / rate)")
    p.add_argument("--live-model", default="smollm2", choices=REFERENCE_MODELS, help="live run: engine model")
    p.add_argument("--live-max-prompt", type=int, default=1536, help="live run: prompt tokens cap")
    p.add_argument("--live-max-output", type=int, default=32, help="live run: output tokens cap")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    args.kv_capacity_tokens = args.kv_cache_mib * 2**20 // KV_BYTES_PER_TOKEN // 16 * 16  # whole 16-token blocks
    if args.quick:
        args.minutes, args.warmup_s, args.slices = 2.0, 10.0, args.slices.split(",")[0]
        args.scenarios = args.scenarios.split(",")[0]
    return args


def policy_plans(args: argparse.Namespace) -> list[tuple[str, str, Policy]]:
    """(family, name, policy): the predictor at each limit, the baseline at each max_waiting, and admit-all."""
    plans: list[tuple[str, str, Policy]] = []
    for fraction in (float(x) for x in args.predictor_limits.split(",")):
        name = "predicted" if fraction == 1.0 else f"predicted(limit={fraction:g}xSLO)"
        plans.append(("predicted", name, predicted_policy(ModelSLO(ttft_slo_s=fraction * args.ttft_slo_s))))
    for i, waiting in enumerate(int(x) for x in args.max_waiting.split(",")):
        name = "observed" if i == 0 else f"observed(max_waiting={waiting})"
        plans.append(("observed", name, observed_policy(ObservedLoadThresholds(max_waiting=waiting))))
    plans.append(("none", "none", admit_all_policy()))
    return plans


def run_scenario(args: argparse.Namespace, constants: EngineConstants, rows: list[TraceRow], start_s: float,
                 prefill_overload: float, decode_overload: float) -> dict[str, Any]:
    scaling = LengthScaling(args.prompt_scale, args.output_scale, args.max_tokens_factor)
    requests = trace_slice(rows, start_s, args.minutes * 60, args.rate, scaling)
    duration = args.minutes * 60 / args.rate
    sizing = size_for_overload(requests, duration, constants, args.max_num_seqs, prefill_overload, decode_overload)
    shape = FleetShape(sizing.n_prefill, sizing.n_decode, constants, args.max_num_seqs, args.kv_capacity_tokens)
    fleet_shape = asdict(sizing) | {"max_num_seqs": args.max_num_seqs, "kv_capacity_tokens": args.kv_capacity_tokens}
    rows_out = []
    for family, name, policy in policy_plans(args):
        result = simulate(requests, shape, policy, duration)
        rows_out.append(measure(result, args.ttft_slo_s, duration, args.warmup_s) | {"policy": name, "family": family})
    log(f"slice {start_s:.0f}s, overload {prefill_overload}:{decode_overload}: " + ", ".join(
        f"{r['policy']} rej {r['rejected']} good {r['goodput_rps']:.2f}/s" for r in rows_out if r["policy"] in ("predicted", "observed")))
    return {"slice_start_s": start_s, "scenario": f"{prefill_overload}:{decode_overload}", "requests": len(requests),
            "simulated_s": duration, "offered_rps": len(requests) / duration,
            "prompt_tokens_mean": sum(r.prompt_tokens for r in requests) / len(requests),
            "output_tokens_mean": sum(r.output_tokens for r in requests) / len(requests), **fleet_shape,
            "policies": rows_out}


def summarise(runs: list[dict[str, Any]], scenario: str) -> list[dict[str, Any]]:
    """Per policy, over the scenario's slices: total rejected, mean goodput, and the mean of the swings."""
    mine = [r for r in runs if r["scenario"] == scenario]
    names = [p["policy"] for p in mine[0]["policies"]]
    table = []
    for name in names:
        rows = [next(p for p in run["policies"] if p["policy"] == name) for run in mine]
        n = len(rows)
        table.append({
            "policy": name, "family": rows[0]["family"], "slices": n,
            "requests": sum(r["requests"] for r in rows),
            "rejected": sum(r["rejected"] for r in rows),
            "goodput_rps": sum(r["goodput_rps"] for r in rows) / n,
            "admitted_missing_slo": sum(r["admitted_missing_slo"] for r in rows),
            "ttft_p50_s": sum(r["ttft_p50_s"] for r in rows) / n,
            "ttft_p90_s": sum(r["ttft_p90_s"] for r in rows) / n,
            "preemptions": sum(r["preemptions"] for r in rows),
            **{f"{q}_{stat}": sum(r[q][stat] for r in rows) / n
               for q in ("prefill_queue", "decode_queue", "decode_running") for stat in ("std", "max_minus_min")},
        })
    return table


def judge(table: list[dict[str, Any]]) -> dict[str, Any]:
    """Predictive vs observed-load admission: as configured by default, and each at its best limit."""
    by = {r["policy"]: r for r in table}

    def verdict(ours: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        fewer, more = ours["rejected"] < base["rejected"], ours["goodput_rps"] > base["goodput_rps"]
        return {"ours": ours["policy"], "baseline": base["policy"], "rejected": [ours["rejected"], base["rejected"]],
                "goodput_rps": [ours["goodput_rps"], base["goodput_rps"]], "fewer_rejections": fewer,
                "more_goodput": more, "met": fewer and more}

    best = lambda family: max((r for r in table if r["family"] == family), key=lambda r: r["goodput_rps"])  # noqa: E731
    return {"defaults": verdict(by["predicted"], by["observed"]), "each_at_best_goodput": verdict(best("predicted"), best("observed"))}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.live_only:
        import json

        report = json.loads(args.out.read_text())
        report["live"] = live_sanity(args)
        report["live_command"] = "benchmarks/admission.py " + " ".join(sys.argv[1:])
        write_json(args.out, report)
        print_report(report)
        return
    constants = calibrate(args.calibrate_threads) if args.calibrate else DEFAULT_CONSTANTS
    overrides = {k: getattr(args, k) for k in ("prefill_tokens_per_s", "decode_step_base_s", "decode_step_per_seq_s")
                 if getattr(args, k) is not None}
    if overrides:
        constants = replace(constants, **overrides, source=f"{constants.source}, overridden: {overrides}")
    log(f"engine constants: {constants}")
    scenarios = [tuple(float(x) for x in item.split(":")) for item in args.scenarios.split(",")]
    slices = [float(x) for x in args.slices.split(",")]
    rows = load_azure_trace(TRACES_DIR / TRACE)
    runs = [run_scenario(args, constants, rows, start, p, d) for p, d in scenarios for start in slices]
    summaries = {f"{p}:{d}": summarise(runs, f"{p}:{d}") for p, d in scenarios}
    live = live_sanity(args) if args.live else None
    report = {
        "benchmark": "admission",
        "kind": "simulation calling fleetctl.gateway.admission.admit_on_predicted_load / admit_on_observed_load",
        "command": "benchmarks/admission.py " + " ".join(sys.argv[1:]),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "engine_constants": vars(constants),
        "summary": {name: {"policies": table, "goal": judge(table)} for name, table in summaries.items()},
        "runs": [{k: v for k, v in run.items() if k != "policies"} | {"policies": [
            {k: v for k, v in p.items() if k != "series"} for p in run["policies"]]} for run in runs],
        "series_main": {p["policy"]: p["series"] for p in runs[0]["policies"]},  # first scenario, first slice
        "live": live,
    }
    write_json(args.out, report)
    print_report(report)


# --- live sanity run -------------------------------------------------------------------------------------


def live_sanity(args: argparse.Namespace) -> dict[str, Any]:
    """The real gateway over 2 reference engines (`--live-model`, mixed), admission on (the predictor, with
    --ttft-slo-s) vs --no-admission, on a short Azure slice at --rate with the simulation's length scaling.
    The observed-load baseline cannot run live: `gateway serve` has no switch for it. Engine queues are
    scraped every 0.5 s. Caches are reset between the two runs."""
    import asyncio
    import random

    import httpx

    from benchmarks.common import Procs, reset_and_wait, start_engines, start_gateway
    from benchmarks.routing import Req

    seconds = 20.0 if args.quick else args.live_seconds
    rows = [r for r in load_azure(TRACE) if r[0] < seconds * args.rate]
    rng = random.Random(0)
    workload = []
    for i, (t, ctx, gen) in enumerate(rows):
        prompt = [rng.randrange(100, 49000) for _ in range(min(args.live_max_prompt, max(1, round(ctx / args.prompt_scale))))]
        workload.append(Req(i, t / args.rate, [], prompt, max(1, min(args.live_max_output, round(gen / args.output_scale)))))
    runs = []
    with Procs() as procs:
        engines = start_engines(procs, 2, args.live_model, 256, 2048, 1)
        model = httpx.get(engines[0].url + "/v1/models", timeout=10).json()["data"][0]["id"]
        for mode, flags in (("predicted (gateway admission on)", ["--ttft-slo-s", str(args.ttft_slo_s)]),
                            ("none (--no-admission)", ["--no-admission"])):
            gateway = start_gateway(procs, engines, flags)
            try:
                httpx.post(gateway.url + "/v1/completions", timeout=120, json={"model": model, "prompt": "warm up", "max_tokens": 1})
                reset_and_wait(engines)
                time.sleep(2.0)
                results, samples, makespan = asyncio.run(_live_run(workload, gateway.url, engines, model))
                reset_and_wait(engines)
                extra = _gateway_view(gateway.url, model, rng)
            finally:
                procs.stop(gateway)
            runs.append(_live_summary(mode, results, samples, makespan, seconds, args.ttft_slo_s) | extra)
            log(f"live {mode}: {runs[-1]}")
    return {"engines": f"2 x {args.live_model} reference engine (mixed, 1 thread, 256 MiB KV)",
            "slice_s": [0, seconds * args.rate], "rate": args.rate,
            "requests": len(workload), "slo_s": args.ttft_slo_s, "max_prompt": args.live_max_prompt,
            "max_output": args.live_max_output, "runs": runs}


async def _live_run(workload: list[Any], url: str, engines: list[Any], model: str) -> tuple[list[Any], list[tuple[int, int]], float]:
    import asyncio

    import httpx

    from benchmarks.common import metric_sum, parse_metrics
    from benchmarks.routing import replay

    samples: list[tuple[int, int]] = []
    done = asyncio.Event()

    async def sample() -> None:
        async with httpx.AsyncClient(timeout=5) as client:
            while not done.is_set():
                waiting = running = 0
                for engine in engines:
                    m = parse_metrics((await client.get(engine.url + "/metrics")).text)
                    waiting += int(metric_sum(m, "vllm:num_requests_waiting"))
                    running += int(metric_sum(m, "vllm:num_requests_running"))
                samples.append((waiting, running))
                await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample())
    try:
        results, makespan = await replay(workload, lambda i: url, model)
    finally:
        done.set()
        await sampler
    return results, samples, makespan


def _gateway_view(url: str, model: str, rng: Any) -> dict[str, Any]:
    """After a run: the gateway's prefill-throughput estimate (a 512-token uncached prompt's predicted prefill
    on an idle engine, from /fleet/route/explain) and its admission rejections by reason."""
    import httpx

    from benchmarks.common import scrape

    prompt = [rng.randrange(100, 49000) for _ in range(512)]
    answer = httpx.post(url + "/fleet/route/explain", json={"model": model, "prompt": prompt, "max_tokens": 1}, timeout=30).json()
    top = answer["candidates"][0]
    samples = scrape(url)
    reasons = {lab.get("reason", ""): v for lab, v in samples.get("fleet_gateway_admission_rejections_total", [])}
    return {"gateway_prefill_tokens_per_s_estimate": 512 / top["predicted_prefill_s"] if top["predicted_prefill_s"] else None,
            "gateway_rejections_by_reason": reasons}


def _live_summary(mode: str, results: list[Any], samples: list[tuple[int, int]], makespan: float, seconds: float,
                  slo_s: float) -> dict[str, Any]:
    rejected = sum(1 for r in results if r.status == 429)
    ok = [r for r in results if r.status == 200 and r.error is None and not math.isnan(r.ttft_s)]
    ttfts = [r.ttft_s for r in ok]
    waiting, running = [s[0] for s in samples] or [0], [s[1] for s in samples] or [0]
    ok_ids = {id(r) for r in ok}
    failed = [r for r in results if r.status != 429 and id(r) not in ok_ids]
    return {"mode": mode, "requests": len(results), "rejected_429": rejected, "errors": len(failed),
            "error_samples": sorted({f"{r.status} {(r.error or '')[:160]}" for r in failed})[:4],
            "goodput_rps": sum(1 for t in ttfts if t <= slo_s) / seconds, "ttft_p50_s": percentile(ttfts, 50),
            "ttft_p90_s": percentile(ttfts, 90), "waiting_std": stdev(waiting), "waiting_swing": max(waiting) - min(waiting),
            "running_std": stdev(running), "running_swing": max(running) - min(running), "makespan_s": makespan}


def print_report(report: dict[str, Any]) -> None:
    cfg = report["config"]
    print(f"\n{TRACE}: slices {cfg['slices']} ({cfg['minutes']:g} min of trace each) at {cfg['rate']:g}x the rate; "
          f"TTFT SLO {cfg['ttft_slo_s']:g}s; SIMULATION calling the gateway's admission functions")
    for scenario, body in report["summary"].items():
        runs = [r for r in report["runs"] if r["scenario"] == scenario]
        fleets = ", ".join(f"{r['n_prefill']}P+{r['n_decode']}D (offered/capacity {r['prefill_overload']:.2f}/{r['decode_overload']:.2f})"
                           for r in runs)
        print(f"\nscenario {scenario} (prefill:decode offered work / capacity): fleets {fleets}")
        print_table(body["policies"], [
            ("policy", "policy", ""), ("rejected", "rejected", "d"), ("goodput/s", "goodput_rps", ".2f"),
            ("admitted>SLO", "admitted_missing_slo", "d"), ("TTFT p50", "ttft_p50_s", ".2f"), ("TTFT p90", "ttft_p90_s", ".2f"),
            ("prefillQ std", "prefill_queue_std", ".1f"), ("swing", "prefill_queue_max_minus_min", ".0f"),
            ("decodeQ std", "decode_queue_std", ".1f"), ("swing", "decode_queue_max_minus_min", ".0f"),
            ("running std", "decode_running_std", ".1f"), ("swing", "decode_running_max_minus_min", ".0f"),
            ("preempt", "preemptions", "d"),
        ])
        for label, g in body["goal"].items():
            print(f"goal ({label}): {g['ours']} vs {g['baseline']}: rejected {g['rejected'][0]} vs {g['rejected'][1]}, "
                  f"goodput {g['goodput_rps'][0]:.2f} vs {g['goodput_rps'][1]:.2f}/s: {'MET' if g['met'] else 'NOT MET'}")
    if report["live"]:
        live = report["live"]
        print(f"\nlive sanity run: real gateway, {live['engines']}, trace 0-{live['slice_s'][1]:.0f}s at {live['rate']:g}x "
              f"({live['requests']} requests, lengths scaled as the simulation's), SLO {live['slo_s']:g}s:")
        print_table(live["runs"], [
            ("mode", "mode", ""), ("429s", "rejected_429", "d"), ("errors", "errors", "d"), ("goodput/s", "goodput_rps", ".2f"),
            ("TTFT p50", "ttft_p50_s", ".2f"), ("TTFT p90", "ttft_p90_s", ".2f"), ("waiting std", "waiting_std", ".1f"),
            ("swing", "waiting_swing", "d"), ("running std", "running_std", ".1f"), ("swing", "running_swing", "d"),
        ])


if __name__ == "__main__":
    main()
