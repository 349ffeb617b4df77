"""Rollout benchmark: what a phased rollout costs the traffic it moves, and how fast a bad one is undone.

    .venv/bin/python benchmarks/rollout.py [--quick] [--nodes 2] [--gateways 2] [--rps 2] [--trials 20]

A local fleet on loopback (fleetctl/localfleet: a controller on SQLite, `--nodes` agents each running one
SmolLM2 reference engine of the model's class revision A, a gateway), plus `--gateways - 1` more gateways,
all refreshing their routing table every `--table-refresh-s`. Steady traffic from
../shared/traces/mooncake_conversation.jsonl (benchmarks/rollout_traffic.py: prompts scaled to
`--block-tokens` real tokens per 512-token trace block, capped at `--max-prompt-tokens`, `--max-tokens`
output tokens, `--rps` requests/s over all gateways in turn) runs from start to end. Then:

1. **Baseline**: `--baseline-s` seconds of traffic on A alone (after a short warm-up).
2. **Rollout** A -> B (B = A with twice the batch limit `max_num_seqs`, a performance-only change):
   `scale`, then setWeight over `--weights` (4 steps by default), a timed pause of `--pause-s` after each
   weight below 100 but the last, and after that one an inline analysis (error rate <= 1%, p90 TTFT <= 2 x
   A's, one `--interval-s` window).
3. **Regression**: a rollout from B (or A, if the rollout did not complete) to C = B made slow (`engine_args: {debug-step-delay-ms: --slow-ms}`,
   the reference engine's test-only per-step delay; tokens unchanged): `scale`, setWeight 50, an analysis
   whose template measures p90 inter-token latency and p90 TTFT against 1.5 x the baseline every
   `--interval-s`, failureLimit 0, inconclusiveLimit 2 (a first window in which too few of C's slow
   requests finished is not the end of the measurement). The gate should abort it.
4. **Abort trials** (`--trials`, minus the regression's one): a rollout from the revision holding the
   traffic (B, after a completed rollout) to the other of A and B (`replicas: 1`; `scale`, setWeight 10, an
   indefinite pause), aborted by the operator once every gateway routes 10% to it.

What is measured (timestamps are this process's monotonic clock; the controller's wall-clock times, on the
same machine, are converted with one offset taken at start):
- **failed or cut**: requests sent while the rollout ran (start call .. `completed` seen) that failed
  (non-200, transport error, in-band error) or were cut (stream without [DONE] or short of max_tokens);
  count and total. The same for the whole run.
- **TTFT ratio**: client-side P99 TTFT of the successful requests sent during the rollout / of those sent
  during the baseline. On a machine whose cores the surge engines share, this counts the surge's CPU too.
- **overhead per step**: (rollout wall time - sum of its pauses - sum of its analysis windows, each window
  taken as its template's initialDelay + count x interval) / number of setWeight steps (the scale step's
  engine start-up is overhead too, spread over them).
- **abort latency**: from the moment the abort is decided to the moment the last gateway reports (GET
  /health `table_generation`) a routing-table generation at or past the first one in which all of the
  model's weight is on A (benchmarks/rollout_timeline.py samples both every 0.1 s, so each figure is
  good to about ±0.1 s). For an operator abort the moment is just before the abort call; for the
  regression it is the failing measurement's recorded time (`gates[].latest.at`). p99 (and max) over all
  trials together, and each kind on its own.
- **detection latency**: from the moment every gateway routes part of the traffic to C (the injection) to
  the failing measurement, and from the rollout's start call; against the template's bound
  initialDelay + interval x (failureLimit + 1).

Results: a table on stdout and benchmarks/results/rollout.json. `--quick` (a few minutes): shorter
baseline, pauses and windows, 4 abort trials.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    RESULTS, BlockText, load_mooncake, log, percentile, print_table, reference_tokenizer_dir, write_json,
)
from benchmarks.rollout_api import RolloutApi  # noqa: E402
from benchmarks.rollout_timeline import Watcher, only_on, share_of  # noqa: E402
from benchmarks.rollout_traffic import TRACE, Result, Traffic, arrival_offsets, build_requests  # noqa: E402

OUT = RESULTS / "rollout.json"
GOALS = {"failed_or_cut": 0, "ttft_p99_ratio": 1.2, "overhead_per_step_s": 15.0, "abort_p99_s": 2.0}
WARM_UP_S = 10.0
TERMINAL = ("completed", "aborted")
INCONCLUSIVE = "InconclusiveAnalysisRun"
FULL = {"baseline_s": 60.0, "pause_s": 20.0, "interval_s": 10.0, "trials": 20}
QUICK = {"baseline_s": 20.0, "pause_s": 5.0, "interval_s": 10.0, "trials": 4}
REGRESSION_WEIGHT = 50  # percent to the slow revision while its analysis runs
TRIAL_WEIGHT = 10  # percent to B when an abort trial aborts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/rollout.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few minutes: short baseline, pauses and windows, 4 trials")
    p.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2", help="the engines' weights (tiny: a smoke run)")
    p.add_argument("--nodes", type=int, default=2, help="agents, one engine of A each (B surges beside them)")
    p.add_argument("--gateways", type=int, default=2, help="gateways the traffic goes through in turn")
    p.add_argument("--rps", type=float, default=2.0, help="requests per second, all gateways together")
    p.add_argument("--arrivals", choices=("steady", "trace"), default="steady",
                   help="steady: evenly spaced; trace: the trace's timestamps scaled to --rps")
    p.add_argument("--max-tokens", type=int, default=12, help="output tokens per request (ignore_eos)")
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--block-tokens", type=int, default=16, help="real tokens per 512-token trace block")
    p.add_argument("--baseline-s", type=float, help="traffic on A alone before the rollout [60; quick 20]")
    p.add_argument("--weights", default="10,25,50,100", help="the rollout's setWeight steps")
    p.add_argument("--pause-s", type=float, help="the pause after each weight below 100 [20; quick 5]")
    p.add_argument("--interval-s", type=float, help="analysis measurement interval [10]")
    p.add_argument("--slow-ms", type=int, default=100, help="the regression's debug-step-delay-ms")
    p.add_argument("--trials", type=int, help="abort trials in all, the regression's one included [20; quick 4]")
    p.add_argument("--table-refresh-s", type=float, default=0.5, help="the gateways' routing-table refresh")
    p.add_argument("--heartbeat-s", type=float, default=1.0, help="agents' heartbeat interval")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.weight_steps = [int(w) for w in args.weights.split(",")]
    return args


# --- the fleet ----------------------------------------------------------------------------------------------


def start_fleet(args: argparse.Namespace, state_dir: Path) -> Any:
    from fleetctl.localfleet import UpOptions, up

    options = UpOptions(state_dir=state_dir, nodes=args.nodes, model=args.model, controller_port=0, gateway_port=0,
                        engine_port_base=random.randrange(20_000, 40_000, 1_000), heartbeat_interval_s=args.heartbeat_s,
                        gateway_table_refresh_s=args.table_refresh_s, ready_timeout_s=600.0)
    return up(options, progress=log)


def measure_on_a_fleet(args: argparse.Namespace, prefix: str, measure: Callable[[argparse.Namespace, Any], Any],
                       what: str = "", start: Callable[[argparse.Namespace, Path], Any] | None = None) -> Any:
    """Start a local fleet in a new state directory (`start`, default start_fleet), `measure(args, record)` on
    it, and stop it, whatever happens; what `measure` returned."""
    from fleetctl.localfleet import down

    state_dir = Path(tempfile.mkdtemp(prefix=prefix))
    log(f"fleet state and logs: {state_dir}{what}")
    record = (start or start_fleet)(args, state_dir)
    try:
        return measure(args, record)
    finally:
        log("stopping the fleet")
        down(state_dir, timeout_s=30.0)


def start_more_gateways(record: Any, count: int, refresh_s: float) -> dict[str, str]:
    """Gateways beyond the local fleet's own, added to fleet.json so `down` stops them too; name -> URL."""
    from agent.ports import free_port
    from fleetctl.localfleet import processes
    from fleetctl.localfleet.fleet import gateway_command, gateway_up, wait_for

    token = Path(record.token_file).read_text().strip()
    gateways = {"local-gateway": record.gateway_url}
    for index in range(2, count + 1):
        name, port = f"bench-gateway-{index}", free_port("127.0.0.1")
        url = f"http://127.0.0.1:{port}"
        argv = gateway_command(record.controller_url, port, refresh_s, name=name)
        info = processes.start("gateway", name, argv, Path(record.log_dir) / f"{name}.log", {"FLEET_TOKEN": token}, url)
        record.processes.append(info)
        record.save()
        wait_for(lambda: gateway_up(url), info, 60.0, f"{name} to load its routing table")
        gateways[name] = url
    return gateways


def make_revisions(api: RolloutApi, class_ref: str, slow_ms: int) -> dict[str, str]:
    """A (the fleet's class), B (twice A's batch limit), C (B made slow); name -> NAME@rN."""
    name = class_ref.split("@")[0]
    spec_a = api.client.get_class(class_ref).spec
    spec_b = {**spec_a, "max_num_seqs": 2 * int(spec_a.get("max_num_seqs", 64))}
    spec_c = {**spec_b, "engine_args": {**spec_b.get("engine_args", {}), "debug-step-delay-ms": slow_ms}}
    reason = "benchmarks/rollout.py"
    return {"A": class_ref, "B": api.client.apply_class(name, spec_b, reason=reason).ref,
            "C": api.client.apply_class(name, spec_c, reason=reason).ref}


# --- specs --------------------------------------------------------------------------------------------------


def rollout_spec(model: str, to: str, weights: list[int], pause_s: float, interval_s: float) -> dict[str, Any]:
    """scale; each weight, then a pause, except after the last weight below 100: the `health` analysis
    (where A still has traffic to compare with, and B the most to measure)."""
    steps: list[dict[str, Any]] = [{"scale": {}}]
    gated = max((w for w in weights if w < 100), default=None)
    for weight in weights:
        steps.append({"setWeight": weight})
        if weight == gated:
            steps.append({"analysis": {"templates": ["health"]}})
        elif weight < 100:
            steps.append({"pause": {"duration": f"{pause_s:g}s"}})
    health = {"metrics": [
        {"name": "errors", "measure": "error_rate", "successCondition": "result <= 0.01", "interval": f"{interval_s:g}s",
         "count": 1, "minRequests": 3},
        {"name": "ttft", "measure": "ttft_p90_s", "successCondition": "result <= 2 * baseline",
         "interval": f"{interval_s:g}s", "count": 1, "minRequests": 3},
    ]}
    return {"model": model, "to": to, "steps": steps, "templates": {"health": health}}


def regression_spec(model: str, to: str, interval_s: float) -> dict[str, Any]:
    latency = {"metrics": [
        {"name": name, "measure": measure, "successCondition": "result <= 1.5 * baseline", "interval": f"{interval_s:g}s",
         "count": 3, "failureLimit": 0, "inconclusiveLimit": 2, "minRequests": 3}
        for name, measure in (("itl", "itl_p90_s"), ("ttft", "ttft_p90_s"))
    ]}
    steps = [{"scale": {}}, {"setWeight": REGRESSION_WEIGHT}, {"analysis": {"templates": ["latency"]}}, {"setWeight": 100}]
    return {"model": model, "to": to, "steps": steps, "templates": {"latency": latency}}


def trial_spec(model: str, to: str) -> dict[str, Any]:
    return {"model": model, "to": to, "replicas": 1, "steps": [{"scale": {}}, {"setWeight": TRIAL_WEIGHT}, {"pause": {}}]}


def nominal_waits_s(spec: dict[str, Any]) -> float:
    """Seconds the spec itself asks to wait: timed pauses, plus each inline analysis's longest metric
    window (initialDelay + count x interval)."""
    from fleetctl.controller.rollout.spec import RolloutSpec

    parsed = RolloutSpec.model_validate(spec)
    total = 0.0
    for step in parsed.steps:
        if getattr(step, "pause", None) is not None and step.pause.duration is not None:
            total += step.pause.duration
        if getattr(step, "analysis", None) is not None:
            metrics = [m for name in step.analysis.templates for m in parsed.templates[name].metrics]
            total += max(m.initial_delay + (m.count or 1) * (m.interval or 0.0) for m in metrics)
    return total


def detection_bound_s(spec: dict[str, Any]) -> float:
    from fleetctl.controller.rollout.spec import RolloutSpec

    metrics = [m for t in RolloutSpec.model_validate(spec).templates.values() for m in t.metrics]
    return min(m.initial_delay + (m.interval or 0.0) * (m.failure_limit + 1) for m in metrics)


# --- phases -------------------------------------------------------------------------------------------------


def wall_to_monotonic(stamp: str, offset: float) -> float:
    return datetime.fromisoformat(stamp).timestamp() - offset


def settled(view: dict[str, Any]) -> bool:
    """Completed, aborted, or waiting for an operator because an analysis could not decide."""
    return view["phase"] in TERMINAL or (view["phase"] == "paused" and view.get("pause_reason") == INCONCLUSIVE)


def wait_settled(api: RolloutApi, rollout_id: int, timeout_s: float) -> dict[str, Any]:
    """The rollout's view once settled; one stuck on an inconclusive analysis (or past the timeout) is
    aborted, so the fleet is back on its A for what follows, and reported with the phase it had."""
    view = api.wait(rollout_id, settled, timeout_s)
    if view["phase"] not in TERMINAL:
        log(f"rollout {rollout_id} {view['phase']} ({view.get('pause_reason')}: {view.get('message')}); aborting it")
        api.abort(rollout_id, reason="benchmarks/rollout.py: rollout did not settle")
        api.wait(rollout_id, lambda v: v["phase"] == "aborted", 120.0)
        view = {**view, "phase": f"{view['phase']} ({view.get('pause_reason') or 'timeout'})"}
    return view


def scale_done_at(api: RolloutApi, rollout_id: int, offset: float) -> float | None:
    """When the rollout's scale step (step 0) was done, on this process's clock: B's engines ready."""
    for event in api.client.rollout_history(rollout_id):
        if event.event == "step_done" and event.message.startswith("step 0 "):
            return wall_to_monotonic(event.at, offset)
    return None


def run_rollout(api: RolloutApi, spec: dict[str, Any], traffic: Traffic, offset: float,
                timeout_s: float) -> dict[str, Any]:
    started = time.monotonic()
    rollout_id = api.start(spec, reason="benchmarks/rollout.py: phased rollout")
    view = api.wait(rollout_id, settled, timeout_s)
    ended = time.monotonic()
    view = wait_settled(api, rollout_id, 0.0) if view["phase"] not in TERMINAL else view
    wall = ended - started
    waits = nominal_waits_s(spec)
    weight_steps = sum(1 for step in spec["steps"] if "setWeight" in step)
    scaled = scale_done_at(api, rollout_id, offset) or started
    # TTFT while B's engines start beside A's on the same cores, and while the traffic moves
    phases = {"scale": traffic_summary(traffic.between(started, scaled))["ttft_p99_s"],
              "traffic_steps": traffic_summary(traffic.between(scaled, ended))["ttft_p99_s"],
              "scale_s": scaled - started}
    return {"ttft_p99_by_phase": phases, "id": rollout_id, "phase": view["phase"], "abort_reason": view.get("abort_reason"), "wall_s": wall,
            "nominal_waits_s": waits, "spec_steps": len(spec["steps"]), "weight_steps": weight_steps,
            "overhead_s": wall - waits, "overhead_per_step_s": (wall - waits) / weight_steps, "window": (started, ended),
            **traffic_summary(traffic.between(started, ended))}


def holder(api: RolloutApi, model: str) -> str:
    """The revision holding the model's traffic now (the next rollout's A)."""
    weights = api.client.get_traffic(model).weights
    return max(weights, key=lambda ref: weights[ref])


def run_regression(api: RolloutApi, spec: dict[str, Any], watcher: Watcher, offset: float,
                   timeout_s: float) -> dict[str, Any]:
    origin, started = holder(api, spec["model"]), time.monotonic()
    rollout_id = api.start(spec, reason="benchmarks/rollout.py: injected latency regression")
    injected = watcher.wait_applied(share_of(spec["to"], REGRESSION_WEIGHT), started, timeout_s)
    view = wait_settled(api, rollout_id, timeout_s)
    failed = [g["latest"] for g in view.get("gates", []) if g.get("latest") and g["latest"]["phase"] == "Failed"]
    out: dict[str, Any] = {"id": rollout_id, "phase": view["phase"], "abort_reason": view.get("abort_reason"),
                           "bound_s": detection_bound_s(spec), "gates": view.get("gates", [])}
    if not failed or injected is None:
        return out
    decided = min(wall_to_monotonic(m["at"], offset) for m in failed)
    back = watcher.wait_applied(only_on(origin), decided, 60.0)
    out |= {"detection_from_injection_s": decided - injected[1], "detection_from_start_s": decided - started,
            "abort_latency_s": None if back is None else back[1] - decided}
    return out


def run_abort_trial(api: RolloutApi, model: str, refs: dict[str, str], watcher: Watcher,
                    timeout_s: float) -> dict[str, Any]:
    """A rollout from the revision holding the traffic to the other of A and B, aborted at TRIAL_WEIGHT."""
    origin = holder(api, model)
    target = refs["A"] if origin != refs["A"] else refs["B"]
    started = time.monotonic()
    rollout_id = api.start(trial_spec(model, target), reason="benchmarks/rollout.py: abort trial")
    split = watcher.wait_applied(share_of(target, TRIAL_WEIGHT), started, timeout_s)
    if split is None:
        wait_settled(api, rollout_id, 0.0)  # aborts it: the next trial needs the model free
        return {"id": rollout_id, "error": "the split never reached every gateway"}
    called = time.monotonic()
    api.abort(rollout_id, reason="benchmarks/rollout.py: abort trial")
    back = watcher.wait_applied(only_on(origin), called, 60.0)
    view = api.wait(rollout_id, lambda v: v["phase"] == "aborted", timeout_s)
    return {"id": rollout_id, "phase": view["phase"], "abort_latency_s": None if back is None else back[1] - called}


# --- results ------------------------------------------------------------------------------------------------


def traffic_summary(results: list[Result]) -> dict[str, Any]:
    failed = [r for r in results if r.failed]
    cut = [r for r in results if r.cut]
    ttfts = [r.ttft_s for r in results if not r.failed and not r.cut]
    served: dict[str, int] = {}
    for r in results:
        served[r.served_by or "?"] = served.get(r.served_by or "?", 0) + 1
    return {"requests": len(results), "failed": len(failed), "cut": len(cut), "rejected_429": sum(r.status == 429 for r in failed),
            "failure_samples": sorted({f"{r.status} {(r.error or 'cut')[:160]}" for r in failed + cut})[:5],
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99), "served_by": served}


def judge(report: dict[str, Any]) -> list[dict[str, Any]]:
    main, trials = report["rollout"], report["abort"]
    rows = [
        {"metric": "failed or cut during the rollout", "value": f"{main['failed'] + main['cut']} of {main['requests']}",
         "goal": "0", "met": main["failed"] + main["cut"] == 0},
        {"metric": "P99 TTFT during / before", "value": f"{report['ttft_p99_ratio']:.2f}",
         "goal": f"<= {GOALS['ttft_p99_ratio']}", "met": report["ttft_p99_ratio"] <= GOALS["ttft_p99_ratio"]},
        {"metric": "  while B's engines start / after", "value": " / ".join(
            f"{main['ttft_p99_by_phase'][k] / report['baseline']['ttft_p99_s']:.2f}" for k in ("scale", "traffic_steps")),
         "goal": f"<= {GOALS['ttft_p99_ratio']}", "met": max(main["ttft_p99_by_phase"][k] for k in (
             "scale", "traffic_steps")) / report["baseline"]["ttft_p99_s"] <= GOALS["ttft_p99_ratio"]},
        {"metric": "overhead per step", "value": f"{main['overhead_per_step_s']:.1f} s",
         "goal": f"< {GOALS['overhead_per_step_s']:g} s", "met": main["overhead_per_step_s"] < GOALS["overhead_per_step_s"]},
        {"metric": f"abort latency p99 ({trials['trials']} trials)", "value": f"{trials['p99_s']:.2f} s (max {trials['max_s']:.2f})",
         "goal": f"< {GOALS['abort_p99_s']:g} s", "met": trials["p99_s"] < GOALS["abort_p99_s"]},
    ]
    regression = report["regression"]
    if "detection_from_injection_s" in regression:
        rows.append({"metric": "detection (injection -> failed measurement)",
                     "value": f"{regression['detection_from_injection_s']:.1f} s",
                     "goal": f"<= {regression['bound_s']:g} s (initialDelay + interval x (failureLimit + 1))",
                     "met": regression["phase"] == "aborted"
                     and regression["detection_from_injection_s"] <= regression["bound_s"]})
    else:
        rows.append({"metric": "detection", "value": f"regression {regression['phase']}", "goal": "aborted", "met": False})
    return rows


def abort_summary(operator: list[dict[str, Any]], regression: dict[str, Any]) -> dict[str, Any]:
    op = [t["abort_latency_s"] for t in operator if t.get("abort_latency_s") is not None]
    gate = [regression["abort_latency_s"]] if regression.get("abort_latency_s") is not None else []
    both = op + gate
    return {"trials": len(both), "p99_s": percentile(both, 99), "p50_s": percentile(both, 50),
            "max_s": max(both) if both else float("nan"), "operator_s": op, "analysis_s": gate,
            "missing": len(operator) + 1 - len(both)}


def print_report(report: dict[str, Any]) -> None:
    cfg = report["config"]
    print(f"\n{TRACE}: {cfg['rps']:g} req/s over {cfg['gateways']} gateway(s), {cfg['nodes']} node(s) of {cfg['model']}, "
          f"weights {cfg['weights']}, pause {cfg['pause_s']:g}s, analysis interval {cfg['interval_s']:g}s")
    print_table(report["goals"], [("metric", "metric", ""), ("value", "value", ""), ("goal", "goal", ""), ("met", "met", "")])


def run(args: argparse.Namespace, state_dir: Path) -> dict[str, Any]:
    from fleetctl.localfleet import down

    record = start_fleet(args, state_dir)
    try:
        return measure(args, record)
    finally:
        log("stopping the fleet")
        down(state_dir, timeout_s=30.0)


def measure(args: argparse.Namespace, record: Any) -> dict[str, Any]:
    token = Path(record.token_file).read_text().strip()
    gateways = start_more_gateways(record, args.gateways, args.table_refresh_s)
    api = RolloutApi(record.controller_url, token)
    refs = make_revisions(api, record.class_ref, args.slow_ms)
    offset = time.time() - time.monotonic()
    blocks = BlockText(reference_tokenizer_dir(), args.block_tokens)
    requests = build_requests(blocks, args.block_tokens, args.max_prompt_tokens, args.max_tokens, limit=4000)
    offsets = arrival_offsets(load_mooncake(TRACE)[:4000], args.rps, args.arrivals)
    watcher = Watcher(record.controller_url, token, gateways, record.served_model).start()
    traffic = Traffic(list(gateways.values()), record.served_model, requests, offsets).start()
    try:
        time.sleep(WARM_UP_S)
        baseline_start = time.monotonic()
        log(f"baseline: {args.baseline_s:g}s on {refs['A']}")
        time.sleep(args.baseline_s)
        baseline = traffic_summary(traffic.between(baseline_start, time.monotonic()))
        log(f"rollout {refs['A']} -> {refs['B']}")
        spec = rollout_spec(record.served_model, refs["B"], args.weight_steps, args.pause_s, args.interval_s)
        main = run_rollout(api, spec, traffic, offset, timeout_s=900.0)
        log(f"rollout {main['phase']} in {main['wall_s']:.1f}s; regression {refs['B']} -> {refs['C']}")
        regression = run_regression(api, regression_spec(record.served_model, refs["C"], args.interval_s), watcher,
                                    offset, timeout_s=600.0)
        log(f"regression {regression['phase']}; {args.trials - 1} abort trials")
        operator = [run_abort_trial(api, record.served_model, refs, watcher, 300.0)
                    for _ in range(max(0, args.trials - 1))]
    finally:
        traffic.stop()
        watcher.stop()
    whole = traffic_summary(traffic.results)
    report = {
        "benchmark": "rollout", "command": "benchmarks/rollout.py " + " ".join(sys.argv[1:]),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_1m_end": os.getloadavg()[0]},
        "revisions": refs, "baseline": baseline, "rollout": {k: v for k, v in main.items() if k != "window"},
        "ttft_p99_ratio": main["ttft_p99_s"] / baseline["ttft_p99_s"], "regression": regression,
        "abort": abort_summary(operator, regression) | {"operator_trials": operator}, "whole_run": whole,
    }
    report["goals"] = judge(report)
    return report


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    state_dir = Path(tempfile.mkdtemp(prefix="fleet-rollout-bench-"))
    log(f"fleet state and logs: {state_dir}")
    report = run(args, state_dir)
    write_json(args.out, report)
    print_report(report)


if __name__ == "__main__":
    main()
