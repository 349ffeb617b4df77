"""The P:D planner live: goodput within SLO with the planner in `auto` vs every fixed ratio (the best chosen
in hindsight) vs a naive utilisation-threshold autoscaler, on a local fleet, as the traffic mix shifts.

    .venv/bin/python benchmarks/pd_compare.py [--model smollm2|tiny] [--engines 4] [--phase-s 150]
        [--rps 1.0,1.0] [--configs 2P:2D,planner,threshold,3P:1D,1P:3D] [--out PATH]

One local fleet (fleetctl/localfleet: a controller on SQLite, two agents, the gateway), the default deployment
scaled to `--engines` engines and made P/D once (`pd rebalance --prefill N/2 --decode N/2 --mixed 0`, as
benchmarks/pd.py does), then reused for every configuration in turn:
- `xP:yD` (every split with at least one engine per role): fixed; the ratio is set before and not touched.
- `planner`: the planner in `auto` mode (`pd mode MODEL auto`, the SLOs below, floors 1) for the run, `off`
  after it; its rebalances run on the controller's own machinery and defaults. It divides by the class's
  engine profile, measured first (below).
- `threshold`: this script's loop, the live twin of fleetctl/sim/pd_control.ThresholdControl: every
  `--threshold-every-s` (10 s) it averages the 1 s samples of `pd status` since its last decision (prefill:
  the fraction of prefill engines with a request running or waiting; decode: running + waiting over the decode
  engines' slots, the profile's `decode_slots`), and if one role is busier than 0.8 and the other idler than
  0.5, rebalances one engine toward the busy role (`pd rebalance` with the API's defaults: the same 30 s
  baseline and the model's SLOs as the planner's rebalances); nothing while a rebalance runs.
Both adaptive configurations start at N/2P:N/2D (not at the best fixed split: that is known only at the end).
Before each configuration the ratio is set (a rebalance with no baseline), every engine must be ready and
routed, and the fleet idles `--settle-s`. The planner runs with the model's cooldown and dwell set to
`--cooldown-s` (60 s) and `--dwell-s` (20 s), so it can change the ratio once in each phase; its cooldown
counts from the model's last rebalance, of anyone, so its configuration first waits out what is left of it
(--no-cooldown-wait: not). Its engine profile is measured first with the `fleetctl pd profile` sweep on one
engine (`--profile measure`, the default; `--profile TOKS:SLOTS` stores the given one instead), as an
operator would before trusting `auto`.

Workload, the same requests (lengths and arrival times) for every configuration: phase 1 `--phase-s` of
Poisson arrivals at the first `--rps` with lengths drawn from ../shared/traces/azure_llm_2023_code.csv, then
phase 2 at the second `--rps` from azure_llm_2023_conv.csv (long prompts and short answers, then the
reverse); lengths scaled as pd_sim's reference class (prompts / 8, outputs / 4; means: code 256 prompt and 7
output tokens, conv 144 and 53), capped at `--max-prompt-tokens` and `--max-tokens` and to the class's
2048-token window. Prompts are real text of exactly that many SmolLM2 tokens (benchmarks/common.BlockText),
unique per request and per configuration (no prefix-cache hit carries over from an earlier one). Each is a
streamed greedy `/v1/completions` through the gateway (benchmarks/rollout_traffic.Traffic, `ignore_eos`:
exactly its output length); TTFT at the first token, mean ITL = (end of stream - first token) / (tokens - 1).
Rates: 1 req/s in each phase (~300 requests per configuration). On 2 CPU cores (4 SmolLM2 engines sharing
them with the controller, the agents, the gateway and this client; a flip's engine start takes a core for
~20 s) that loads the engines without swamping them: in a smoke run with 90 s phases, fixed 1P:3D's one
prefill engine was 86% busy on code (TTFT p50 4.2 s; goodput 0.81), the threshold autoscaler (3P:1D for most
of it) 0.90, its one decode engine filling its KV on conv (the gateway's admission refused 10 requests with
429: counted as dropped, and shown apart). At 0.4 req/s every split served everything within SLO.
Requests dropped are requests that did not complete; the ones that completed outside the SLOs only lower
goodput.

Per configuration: goodput within SLO (the fraction of all requests sent that completed with TTFT <=
`--ttft-slo-s` and mean ITL <= `--itl-slo-s`, as pd_sim counts it), overall and per phase; role flips made
(the rebalances created during its traffic); requests dropped (failed: non-200 incl. admission 429s,
transport or in-band error; cut; unfinished), and those of them in flight while a flip ran (flip_started to
flip_done); TTFT p50/p99; the ratio and the planner's advice over time (JSON).
SLOs: TTFT 10 s, mean ITL 0.3 s, pd_sim's reference class (the planner gets the same ones).
Then the best fixed split in hindsight, planner / best fixed (goal >= 0.95x), threshold vs planner (goal:
the planner better), drops (goal 0). Results: a table on stdout, benchmarks/results/pd_compare.json
(rewritten after each configuration, so a stopped run keeps what it measured). Default run ~33 min (estimated)
on 2 cores with SmolLM2; run it alone on an idle machine. `--model tiny --phase-s 20 --no-cooldown-wait`: a smoke.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    RESULTS, BlockText, log, percentile, print_table, reference_tokenizer_dir, wait, write_json,
)
from benchmarks.pd import flip_spans, rebalance  # noqa: E402
from benchmarks.rollout import measure_on_a_fleet  # noqa: E402
from benchmarks.rollout_traffic import Req, Result, Traffic  # noqa: E402
from fleetctl.errors import FleetError  # noqa: E402
from fleetctl.pd.planner import PlannerSettings  # noqa: E402
from fleetctl.sim.workload import TRACES_DIR, LengthScaling, load_azure_trace, sampled_workload  # noqa: E402

OUT = RESULTS / "pd_compare.json"
PHASES = (("code", "azure_llm_2023_code.csv", 1), ("conv", "azure_llm_2023_conv.csv", 2))  # name, trace, seed
SCALING = LengthScaling(8.0, 4.0)  # pd_sim's reference class
MAX_MODEL_LEN = 2048  # the replica class's default context window
BLOCK_TOKENS = 32  # tokens per BlockText block (prompts are unique: the size only groups them)
REASON = "benchmarks/pd_compare.py"
GOAL_VS_BEST = 0.95


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/pd_compare.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2",
                   help="the engines' weights (tiny: a smoke run)")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--phase-s", type=float, default=150.0, help="seconds of each trace")
    p.add_argument("--rps", default="1.0,1.0", help="arrival rate of the code phase, then of the conv phase")
    p.add_argument("--configs", default=None,
                   help="comma list of NP:MD, planner, threshold, in the order run [N/2P:N/2D,planner,threshold,"
                        "then the other splits, most prefill first]")
    p.add_argument("--ttft-slo-s", type=float, default=10.0)
    p.add_argument("--itl-slo-s", type=float, default=0.3, help="on a request's mean inter-token latency")
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--settle-s", type=float, default=20.0, help="idle before each configuration")
    p.add_argument("--threshold-every-s", type=float, default=10.0)
    p.add_argument("--cooldown-s", type=float, default=60.0, help="the planner's cooldown for the run")
    p.add_argument("--dwell-s", type=float, default=PlannerSettings().dwell_s, help="the planner's dwell for the run")
    p.add_argument("--cooldown-wait", action=argparse.BooleanOptionalAction, default=True,
                   help="before the planner's run, wait until the model's last rebalance is --cooldown-s old")
    p.add_argument("--profile", default="measure", metavar="measure|TOKS:SLOTS|none",
                   help="measure: `fleetctl pd profile` first; TOKS:SLOTS: store that profile (prefill tok/s : "
                        "decode slots); none: the planner's built-in default")
    p.add_argument("--table-refresh-s", type=float, default=None)
    p.add_argument("--heartbeat-s", type=float, default=1.0)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    args.rates = [float(r) for r in args.rps.split(",")]
    if len(args.rates) != len(PHASES):
        p.error("--rps: two rates, the code phase's and the conv phase's")
    splits = [f"{n}P:{args.engines - n}D" for n in range(args.engines - 1, 0, -1)]
    half = f"{args.engines // 2}P:{args.engines - args.engines // 2}D"
    default = [half, "planner", "threshold"] + [s for s in splits if s != half]
    args.config_list = args.configs.split(",") if args.configs else default
    for name in args.config_list:
        if name not in splits + ["planner", "threshold"]:
            p.error(f"--configs: {name!r} is none of {', '.join(splits + ['planner', 'threshold'])}")
    return args


# --- the workload ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    index: int
    phase: str
    arrival_s: float  # from the start of the configuration's traffic
    prompt_tokens: int
    output_tokens: int


def workload(args: argparse.Namespace) -> list[Planned]:
    planned: list[Planned] = []
    for number, ((phase, trace, seed), rate) in enumerate(zip(PHASES, args.rates)):
        for spec in sampled_workload(load_azure_trace(TRACES_DIR / trace), rate, args.phase_s, SCALING, seed):
            prompt = min(spec.prompt_tokens, args.max_prompt_tokens, MAX_MODEL_LEN - 2)
            output = max(1, min(spec.output_tokens, args.max_tokens, MAX_MODEL_LEN - 1 - prompt))
            planned.append(Planned(len(planned), phase, number * args.phase_s + spec.arrival_s, prompt, output))
    return planned


def requests_for(planned: list[Planned], blocks: BlockText, salt: int) -> list[Req]:
    """Each planned request as text of exactly its length, unique to it and to the configuration (`salt`)."""
    out = []
    for p in planned:
        hash_ids = [f"pd_compare:{salt}:{p.index}:{k}" for k in range(math.ceil(p.prompt_tokens / BLOCK_TOKENS))]
        out.append(Req(p.index, blocks.text(blocks.prompt_ids(hash_ids, p.prompt_tokens)), p.output_tokens))
    return out


def mean_itl(r: Result) -> float:
    tokens = r.completion_tokens or r.tokens
    if tokens <= 1:
        return 0.0
    return (r.finished_at - r.sent_at - r.ttft_s) / (tokens - 1)


# --- the fleet ---------------------------------------------------------------------------------------------


def ratio_of(view: Any) -> tuple[int, int]:
    return view.ratio.prefill, view.ratio.decode


def status(api: Any, model: str) -> Any:
    return api.pd_status(model)[0]


def gateway_routes(url: str, engines: int) -> bool:
    try:
        table = httpx.get(f"{url}/health", timeout=5.0).json().get("engines", {})
    except (httpx.HTTPError, ValueError):
        return False
    return sum(1 for e in table.values() if e.get("healthy")) >= engines


def wait_ready(api: Any, record: Any, engines: int) -> None:
    def ready() -> bool:
        view = status(api, record.served_model)
        serving = [e for e in view.engines if e.state == "ready" and not e.draining and e.role in ("prefill", "decode")]
        return view.rebalance is None and len(serving) == engines and gateway_routes(record.gateway_url, engines)

    wait(ready, 600, "every engine ready and routed", every_s=1.0)


def set_ratio(api: Any, record: Any, prefill: int, decode: int, engines: int) -> None:
    if ratio_of(status(api, record.served_model)) != (prefill, decode):
        log(f"rebalancing to {prefill}P:{decode}D")
        rebalance(api, record.served_model, prefill, decode, None, REASON)
    wait_ready(api, record, engines)


def finish_rebalance(api: Any, model: str) -> None:
    """Stop a rebalance still running (after its flip in progress) and wait until it is done."""
    active = status(api, model).rebalance
    if active is None:
        return
    log(f"stopping rebalance {active.id} (after its flip in progress)")
    try:
        api.stop_rebalance(active.id, reason=f"{REASON}: the configuration's traffic is over")
    except FleetError as exc:
        log(f"  stop: {exc}")
    wait(lambda: api.get_rebalance(active.id).phase in ("completed", "stopped"), 600, f"rebalance {active.id}", 1.0)


def wait_cooldown(api: Any, model: str, cooldown_s: float) -> None:
    rows = api.list_rebalances(model)
    if not rows:
        return
    left = cooldown_s - (time.time() - datetime.fromisoformat(rows[0].updated_at).timestamp())
    if left > 0:
        log(f"waiting {left:.0f} s: the planner's cooldown after rebalance {rows[0].id}")
        time.sleep(left)


# --- one configuration -------------------------------------------------------------------------------------


@dataclass
class Sample:
    at: float  # monotonic
    ratio: str
    prefill_busy: float  # fraction of serving prefill engines with a request running or waiting
    decode_busy: float  # running + waiting over the serving decode engines' slots
    prefill: int  # the ratio's (the deployments')
    decode: int
    rebalancing: bool
    advice: str | None


def sample(view: Any, slots: float) -> Sample:
    serving = [e for e in view.engines if e.state == "ready" and not e.draining]
    prefill = [e for e in serving if e.role == "prefill"]
    decode = [e for e in serving if e.role == "decode"]
    rec = view.recommendation
    advice = None
    if rec is not None:
        r = rec.recommended
        advice = (f"{rec.action} {r.prefill}P:{r.decode}D" + (f" (held: {rec.blocked_by})" if rec.blocked_by else "")
                  if rec.measured else "not measured")
    return Sample(time.monotonic(), f"{view.ratio.prefill}P:{view.ratio.decode}D",
                  sum(1 for e in prefill if e.running + e.waiting > 0) / max(len(prefill), 1),
                  sum(e.running + e.waiting for e in decode) / max(len(decode) * slots, 1e-9),
                  view.ratio.prefill, view.ratio.decode, view.rebalance is not None, advice)


def threshold_step(api: Any, model: str, window: list[Sample], floor: int = 1, high: float = 0.8,
                   low: float = 0.5) -> str | None:
    """ThresholdControl's rule on the window's averages; the rebalance started, in words, or None."""
    busy_p = statistics.mean(s.prefill_busy for s in window)
    busy_d = statistics.mean(s.decode_busy for s in window)
    p, d = window[-1].prefill, window[-1].decode
    if busy_p > high and busy_d < low and d > floor:
        target = (p + 1, d - 1)
    elif busy_d > high and busy_p < low and p > floor:
        target = (p - 1, d + 1)
    else:
        return None
    try:
        api.pd_rebalance(model, target[0], target[1], apply=True,
                         reason=f"{REASON}: threshold autoscaler (prefill {busy_p:.2f}, decode {busy_d:.2f} busy)")
    except FleetError as exc:
        log(f"  threshold: no rebalance: {exc}")
        return None
    return f"{p}P:{d}D -> {target[0]}P:{target[1]}D (prefill {busy_p:.2f}, decode {busy_d:.2f} busy)"


def observe(api: Any, model: str, until: float, threshold_every_s: float | None) -> tuple[list[Sample], list[str]]:
    """Sample `pd status` every second until `until`; with `threshold_every_s`, run the threshold autoscaler."""
    samples: list[Sample] = []
    decisions: list[str] = []
    window: list[Sample] = []
    last = time.monotonic()
    while time.monotonic() < until:
        try:
            view = status(api, model)
        except (FleetError, httpx.HTTPError) as exc:
            log(f"  pd status: {exc}")
            time.sleep(1.0)
            continue
        s = sample(view, float(view.profile.get("decode_slots") or 1.0))
        samples.append(s)
        window = [] if s.rebalancing else window + [s]  # a flip in flight: decide on what follows it
        if threshold_every_s is not None and time.monotonic() - last >= threshold_every_s:
            last = time.monotonic()
            if window and (what := threshold_step(api, model, window)):
                log(f"  threshold: {what}")
                decisions.append(what)
            window = []
        time.sleep(max(0.0, 1.0 - (time.monotonic() - s.at)))
    return samples, decisions


def transitions(samples: list[Sample], key: str, start: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for s in samples:
        value = getattr(s, key)
        if not out or out[-1]["value"] != value:
            out.append({"t_s": round(s.at - start, 1), "value": value})
    return out


def run_config(api: Any, record: Any, args: argparse.Namespace, name: str, planned: list[Planned],
               requests: list[Req]) -> dict[str, Any]:
    model = record.served_model
    adaptive = name in ("planner", "threshold")
    half = args.engines // 2
    prefill, decode = (half, args.engines - half) if adaptive else map(int, name.replace("D", "").split("P:"))
    set_ratio(api, record, prefill, decode, args.engines)
    if name == "planner" and args.cooldown_wait:
        wait_cooldown(api, model, args.cooldown_s)
    time.sleep(args.settle_s)
    before = max((r.id for r in api.list_rebalances(model)), default=0)
    offset = time.time() - time.monotonic()
    if name == "planner":
        api.pd_settings(model, mode="auto", reason=f"{REASON}: the planner's run")
    log(f"{name}: {len(requests)} requests over {2 * args.phase_s:g} s from {prefill}P:{decode}D")
    traffic = Traffic([record.gateway_url], model, requests, iter([p.arrival_s for p in planned]))
    traffic.start()
    start = time.monotonic()
    try:
        samples, decisions = observe(api, model, start + 2 * args.phase_s + 2.0,  # the last arrival, and a margin
                                     args.threshold_every_s if name == "threshold" else None)
    finally:
        if name == "planner":
            api.pd_settings(model, mode="off", reason=f"{REASON}: the planner's run is over")
        traffic.stop(drain_s=300.0)
    end = time.monotonic()
    log(f"{name}: traffic done ({end - start - 2 * args.phase_s:.0f} s of drain)")
    finish_rebalance(api, model)
    made = [api.get_rebalance(r.id) for r in api.list_rebalances(model) if r.id > before]
    made = [v for v in made if datetime.fromisoformat(v.created_at).timestamp() - offset < end]
    spans = [s | {"rebalance": v.id} for v in sorted(made, key=lambda v: v.id) for s in flip_spans(v)]
    return summarise(name, planned, traffic.results, spans, made, samples, decisions, start, offset, args) | {
        "start_ratio": f"{prefill}P:{decode}D", "end_ratio": "{}P:{}D".format(*ratio_of(status(api, model)))}


def summarise(name: str, planned: list[Planned], results: list[Result], spans: list[dict[str, Any]], made: list[Any],
              samples: list[Sample], decisions: list[str], start: float, offset: float,
              args: argparse.Namespace) -> dict[str, Any]:
    by_index = {r.row: r for r in results}
    flips_mono = [(s["started_at"] - offset, s["done_at"] - offset) for s in spans]

    def good(r: Result | None) -> bool:
        return (r is not None and not r.failed and not r.cut and r.ttft_s <= args.ttft_slo_s
                and mean_itl(r) <= args.itl_slo_s)

    def dropped(r: Result | None) -> bool:
        return r is None or r.failed or r.cut

    def during_flip(r: Result) -> bool:
        ended = r.finished_at
        return any(r.sent_at < done and ended > began for began, done in flips_mono)

    phases = {}
    for number, (phase, _, _) in enumerate(PHASES):
        mine = [p for p in planned if p.phase == phase]
        busy = [s for s in samples if (s.at - start) // args.phase_s == number]
        phases[phase] = {"requests": len(mine),
                         "goodput": sum(good(by_index.get(p.index)) for p in mine) / max(len(mine), 1),
                         "prefill_busy": statistics.mean(s.prefill_busy for s in busy) if busy else None,
                         "decode_busy": statistics.mean(s.decode_busy for s in busy) if busy else None}
    served = [r for r in results if not r.failed and not r.cut]
    failed = [r for r in results if r.failed]
    cut = [r for r in results if r.cut]
    ttfts, itls = [r.ttft_s for r in served], [mean_itl(r) for r in served]
    return {
        "config": name, "requests": len(planned),
        "goodput": sum(good(by_index.get(p.index)) for p in planned) / max(len(planned), 1), "phases": phases,
        "completed": len(served),
        "dropped": sum(dropped(by_index.get(p.index)) for p in planned),
        "failed": len(failed), "rejected_429": sum(r.status == 429 for r in failed), "cut": len(cut),
        "unfinished": len(planned) - len(by_index),
        "dropped_during_flips": sum(1 for r in failed + cut if during_flip(r)),
        "failure_samples": sorted({f"{r.status} {(r.error or 'cut')[:160]}" for r in failed + cut})[:5],
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
        "itl_p50_s": percentile(itls, 50), "itl_p99_s": percentile(itls, 99),
        "flips": len(spans), "flip_s_mean": statistics.mean(s["seconds"] for s in spans) if spans else None,
        "rebalances": [{"id": v.id, "by": v.created_by, "target": f"{v.target.prefill}P:{v.target.decode}D",
                        "phase": v.phase, "flips": len(v.flips), "message": v.message,
                        "created_s": round(datetime.fromisoformat(v.created_at).timestamp() - offset - start, 1)}
                       for v in made],
        "flip_spans": spans, "threshold_decisions": decisions,
        "ratio_timeline": transitions(samples, "ratio", start),
        "advice_timeline": transitions(samples, "advice", start),
    }


# --- the report --------------------------------------------------------------------------------------------


def verdict(configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    fixed = {n: c for n, c in configs.items() if n not in ("planner", "threshold")}
    out: dict[str, Any] = {}
    if fixed:
        best = max(fixed, key=lambda n: fixed[n]["goodput"])
        out["best_fixed"] = {"config": best, "goodput": fixed[best]["goodput"]}
        if "planner" in configs and fixed[best]["goodput"] > 0:
            ratio = configs["planner"]["goodput"] / fixed[best]["goodput"]
            out["planner_vs_best_fixed"] = {"ratio": ratio, "goal": GOAL_VS_BEST, "met": ratio >= GOAL_VS_BEST}
    if "planner" in configs and "threshold" in configs:
        p, t = configs["planner"]["goodput"], configs["threshold"]["goodput"]
        out["planner_vs_threshold"] = {"planner": p, "threshold": t, "met": p > t}
    adaptive = [c for n, c in configs.items() if n in ("planner", "threshold")]
    out["dropped_in_adaptive"] = {"dropped": sum(c["dropped"] for c in adaptive),
                                  "requests": sum(c["requests"] for c in adaptive),
                                  "met": all(c["dropped"] == 0 for c in adaptive)}
    return out


def print_report(report: dict[str, Any]) -> None:
    cfg = report["settings"]
    print(f"\n{report['engines']} {report['model']} engines; {cfg['phase_s']:g} s of code at {cfg['rates'][0]:g} req/s "
          f"then {cfg['phase_s']:g} s of conv at {cfg['rates'][1]:g} req/s; SLO TTFT {cfg['ttft_slo_s']:g} s, "
          f"mean ITL {cfg['itl_slo_s']:g} s")
    rows = [{**c, "code": c["phases"]["code"]["goodput"], "conv": c["phases"]["conv"]["goodput"],
             "drops": f"{c['dropped']}/{c['requests']} ({c['rejected_429']} 429, {c['dropped_during_flips']} in flips)",
             "ratios": f"{c['start_ratio']} -> {c['end_ratio']}"} for c in report["configs"].values()]
    print_table(rows, [("config", "config", ""), ("goodput", "goodput", ".3f"), ("code", "code", ".3f"),
                       ("conv", "conv", ".3f"), ("flips", "flips", "d"), ("dropped", "drops", ""),
                       ("TTFT p50", "ttft_p50_s", ".2f"), ("TTFT p99", "ttft_p99_s", ".2f"),
                       ("ITL p50", "itl_p50_s", ".3f"), ("ratio", "ratios", "")])
    v = report["verdict"]
    if "best_fixed" in v:
        print(f"best fixed in hindsight: {v['best_fixed']['config']} ({v['best_fixed']['goodput']:.3f})")
    if "planner_vs_best_fixed" in v:
        x = v["planner_vs_best_fixed"]
        print(f"planner / best fixed: {x['ratio']:.2f}x (goal >= {x['goal']:.2f}x: {'met' if x['met'] else 'not met'})")
    if "planner_vs_threshold" in v:
        x = v["planner_vs_threshold"]
        print(f"planner {x['planner']:.3f} vs threshold {x['threshold']:.3f} (goal: planner better: "
              f"{'met' if x['met'] else 'not met'})")
    d = v["dropped_in_adaptive"]
    print(f"dropped under the adaptive configurations: {d['dropped']} of {d['requests']} (goal 0: "
          f"{'met' if d['met'] else 'not met'})")


def measure_profile(record: Any, args: argparse.Namespace) -> None:
    """`fleetctl pd profile CLASS_REF` within the run's SLOs, stored for the planner (on a mixed engine,
    before the fleet turns P/D: nothing else runs on it then)."""
    log(f"profiling one engine of {record.class_ref} (fleetctl pd profile)")
    command = [sys.executable, "-m", "fleetctl.cli.main", "--controller", record.controller_url, "--token",
               Path(record.token_file).read_text().strip(), "pd", "profile", record.class_ref,
               "--ttft-slo", str(args.ttft_slo_s), "--itl-slo", str(args.itl_slo_s), "--prompt-words", "128",
               "--decode-concurrency", "1,2,4,8,16", "--reason", REASON, "-o", "json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"pd profile failed: {done.stderr.strip().splitlines()[-1:]}")
    stored = json.loads(done.stdout)
    log(f"profile: {stored['prefill_tokens_per_s']:.0f} prompt tok/s, {stored['decode_slots']:g} decode slots at "
        f"ITL {stored['decode_itl_s']:.3f} s")


def measure(args: argparse.Namespace, record: Any) -> dict[str, Any]:
    from fleetctl.client import ControllerClient

    api = ControllerClient(record.controller_url, Path(record.token_file).read_text().strip(), timeout=15.0)
    model = record.served_model
    api.set_deployment("local", record.class_ref, args.engines, reason=REASON)
    wait(lambda: sum(e.state == "ready" for e in api.list_engines()) >= args.engines, 900, "the engines", 1.0)
    api.pd_settings(model, mode="off", ttft_slo_s=args.ttft_slo_s, itl_slo_s=args.itl_slo_s, floor_prefill=1,
                    floor_decode=1, cooldown_s=args.cooldown_s, dwell_s=args.dwell_s, reason=REASON)
    if args.profile == "measure":
        measure_profile(record, args)
    elif args.profile != "none":
        tokens, slots = (float(x) for x in args.profile.split(":"))
        api.set_pd_profile(record.class_ref, tokens, slots, reason=REASON)
    half = args.engines // 2
    log(f"mixed -> {half}P:{args.engines - half}D")
    rebalance(api, model, half, args.engines - half, 0, REASON)
    wait_ready(api, record, args.engines)
    planned = workload(args)
    blocks = BlockText(reference_tokenizer_dir(), BLOCK_TOKENS)
    report: dict[str, Any] = {
        "benchmark": "pd_compare", "command": "benchmarks/pd_compare.py " + " ".join(sys.argv[1:]),
        "machine": {"node": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "date": time.strftime("%Y-%m-%d"), "model": args.model, "engines": args.engines,
        "settings": {"phase_s": args.phase_s, "rates": args.rates, "ttft_slo_s": args.ttft_slo_s,
                     "itl_slo_s": args.itl_slo_s, "max_prompt_tokens": args.max_prompt_tokens,
                     "max_tokens": args.max_tokens, "settle_s": args.settle_s, "configs": args.config_list,
                     "planner": status(api, model).settings, "profile": status(api, model).profile},
        "workload": {phase: {"requests": len(mine),
                             "prompt_tokens_mean": statistics.mean(p.prompt_tokens for p in mine),
                             "output_tokens_mean": statistics.mean(p.output_tokens for p in mine)}
                     for phase, _, _ in PHASES if (mine := [p for p in planned if p.phase == phase])},
        "configs": {},
    }
    for phase, w in report["workload"].items():
        log(f"workload {phase}: {w['requests']} requests, prompts {w['prompt_tokens_mean']:.0f} tokens, "
            f"outputs {w['output_tokens_mean']:.1f} tokens on average")
    for salt, name in enumerate(args.config_list):
        result = run_config(api, record, args, name, planned, requests_for(planned, blocks, salt))
        report["configs"][name] = result
        report["verdict"] = verdict(report["configs"])
        write_json(args.out, report)
        log(f"{name}: goodput {result['goodput']:.3f} (code {result['phases']['code']['goodput']:.3f}, conv "
            f"{result['phases']['conv']['goodput']:.3f}), {result['flips']} flips, {result['dropped']} dropped, "
            f"TTFT p50 {result['ttft_p50_s']:.2f} s p99 {result['ttft_p99_s']:.2f} s")
    return report


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print_report(measure_on_a_fleet(args, "fleet-pd-compare-", measure,
                                    f"; configurations: {', '.join(args.config_list)}"))


if __name__ == "__main__":
    main()
