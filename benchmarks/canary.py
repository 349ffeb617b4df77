"""Quality-canary benchmark: how fast the canary catches silently wrong answers, how often it cries wolf, and
what its probes cost, on a local fleet of SmolLM2 engines under replayed traffic at the default probe budget.

    .venv/bin/python benchmarks/canary.py [--clean-s 3600] [--drill-s 600] [--phases clean,misroute,plant,fraction]

A local fleet on loopback (fleetctl/localfleet: a controller on SQLite with the canary at its DEFAULT settings,
`--nodes` agents each running one SmolLM2 engine of the model's class revision A, a gateway). Steady traffic
from ../shared/traces/mooncake_conversation.jsonl (benchmarks/rollout_traffic.py) runs throughout. The
reference is recorded from A with `fleetctl canary record --golden GOLDEN --repetitions 8 --conditions 1,4` first
(176 runs: the noise bound p0 at 0.017). Then, per phase:

- **clean**: `--clean-s` seconds with nothing wrong: every alert raised is a false alarm.
- **misroute**: for each correctness-different class (LONG: RoPE scaling 4 with an 8192-token window; KV16: a
  float16 KV cache; TOPK: the approximate top-k sampler), one engine of it is deployed at weight 0, then
  `fleetctl drill misroute --fraction 0.15`; measured: seconds from the drill's start to the first alert
  naming that class (its own pinned stream, which may fire before the drill starts: 0, or the production
  stream blaming it), and to the production stream's (at most `--drill-s`); then the drill is stopped, the
  streams recover and the class is scaled to 0.
- **plant**: for each planted fault (kv_fp16, approx_topk, rope_perturb), `fleetctl drill plant` on one of
  A's engines; measured: seconds to the first alert of any stream naming that engine (at most `--drill-s`).
- **fraction**: misroutes to LONG at each of `--fractions` (default 0.05), for at most `--fraction-s` (30 min)
  each: the smallest fraction detected in that time.

Probe cost: `fleet_canary_probe_share` (the controller's own figure: probe tokens/s over the busy capacity) sampled
every 10 s, and the probe share of served tokens from the engines' own counters (vllm:prompt_tokens_total +
vllm:generation_tokens_total of every engine, read every 10 s and summed as increments, so engines restarted or
removed by a drill still count) against the gateway's probe tokens
(fleet_gateway_probe_tokens_total, fillers included). Results: a table on stdout and benchmarks/results/canary.json.
Run it alone on an otherwise idle machine: every figure is a wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import BlockText, load_mooncake, log, print_table, reference_tokenizer_dir, write_json  # noqa: E402
from benchmarks.rollout import measure_on_a_fleet  # noqa: E402
from benchmarks.rollout_traffic import TRACE, Traffic, arrival_offsets, build_requests  # noqa: E402
from engine.contract.prometheus import parse_samples, sum_series  # noqa: E402
from fleetctl.client import ControllerClient  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "canary.json"
GOALS = {"detect_s": 600.0, "false_alarms": 0, "probe_share": 0.02, "smallest_fraction": 0.05}
ALARMS = ("drifting", "failing")
BAD_CLASSES = {
    "LONG": {"rope_scaling": 4.0, "max_model_len": 8192},
    "KV16": {"kv_cache_dtype": "float16"},
    "TOPK": {"sampler": "approximate_topk"},
}
FAULTS = ("kv_fp16", "approx_topk", "rope_perturb")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/canary.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--phases", default="clean,misroute,plant,fraction", help="which phases, in this order")
    p.add_argument("--nodes", type=int, default=2, help="agents, one engine of A each")
    p.add_argument("--classes", default=",".join(BAD_CLASSES), help="the misroute phase's targets, in order")
    p.add_argument("--faults", default=",".join(FAULTS), help="the plant phase's faults, in order")
    p.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2", help="the engines' weights (tiny: a smoke run)")
    p.add_argument("--golden", help="the golden set to record and probe with [smollm2-quick; tiny with --model tiny]")
    p.add_argument("--rps", type=float, default=1.0, help="user requests per second")
    p.add_argument("--max-tokens", type=int, default=12, help="output tokens per user request (ignore_eos)")
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--block-tokens", type=int, default=16, help="real tokens per 512-token trace block")
    p.add_argument("--clean-s", type=float, default=3600.0, help="the clean run's length")
    p.add_argument("--drill-s", type=float, default=600.0, help="the longest a drill may take to be detected")
    p.add_argument("--fractions", default="0.05", help="misroute fractions for the smallest-fraction phase")
    p.add_argument("--fraction-s", type=float, default=1800.0, help="the longest each fraction may take")
    p.add_argument("--recover-s", type=float, default=600.0, help="the longest a stream may take to recover")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    args.golden = args.golden or ("smollm2-quick" if args.model == "smollm2" else "tiny")
    return args


class Bench:
    """The fleet and the calls the phases make."""

    def __init__(self, record: Any, args: argparse.Namespace):
        self.record, self.args = record, args
        self.token = Path(record.token_file).read_text().strip()
        self.api = ControllerClient(record.controller_url, token=self.token, timeout=30.0)
        self.model, self.a = record.served_model, record.class_ref
        self.env = {**os.environ, "FLEET_CONTROLLER": record.controller_url, "FLEET_TOKEN": self.token,
                    "PYTHONPATH": str(ROOT)}

    def cli(self, *args: str, timeout_s: float = 1800.0) -> subprocess.CompletedProcess[str]:
        from fleetctl.localfleet.processes import fleetctl_argv

        done = subprocess.run(fleetctl_argv(*args), env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"fleetctl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def alerts_since(self, event_id: int) -> list[Any]:
        return [e for e in self.api.canary_events(model=self.model, limit=1000)
                if e.id > event_id and e.verdict_to in ALARMS]

    def last_event_id(self) -> int:
        events = self.api.canary_events(model=self.model, limit=1000)
        return max((e.id for e in events), default=0)

    def production(self) -> Any:
        return next((s for s in self.api.canary_status(model=self.model) if s.kind == "production"), None)

    def wait(self, condition: Any, timeout_s: float, every_s: float = 2.0) -> float | None:
        """Seconds until `condition()` held; None on timeout."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if condition():
                return time.monotonic() - start
            time.sleep(every_s)
        return None

    def probe_log(self, ref: str, since: datetime, engine: str | None = None) -> list[dict[str, Any]]:
        """The probes `ref` served since `since` (of `engine` only, if given), one line each: what a drill's
        detection time comes from (when, which stream, which prompt, at which batch, and whether it was bad)."""
        view = self.api.canary_class(ref, limit=1000)
        rows = []
        for probe in view.probes:
            at = datetime.fromisoformat(probe.at)
            if at < since or (engine is not None and probe.engine != engine):
                continue
            score = probe.score
            rows.append({"s": round((at - since).total_seconds(), 1), "kind": probe.kind, "engine": probe.engine,
                         "condition": probe.condition, "batch": probe.batch_size, "prompt": probe.prompt_id,
                         "bad": score.diverged if score else None, "error": probe.error})
        return rows

    def recovered(self) -> bool:
        return all(s.verdict not in ALARMS for s in self.api.canary_status(model=self.model)
                   if s.class_ref in (None, self.a))

    def ready(self, ref: str) -> list[str]:
        return sorted(e.name for e in self.api.list_engines() if e.class_ref == ref and e.state == "ready")

    def engine_counters(self) -> dict[str, float]:
        """engine name -> prompt + generation tokens it has served (its own counters, since it started)."""
        counters = {}
        for engine in self.api.list_engines():
            if engine.url:
                try:
                    text = httpx.get(f"{engine.url}/metrics", timeout=5.0).text
                except httpx.HTTPError:
                    continue
                samples = parse_samples(text)
                counters[engine.name] = (sum_series(samples, "vllm:prompt_tokens_total")
                                         + sum_series(samples, "vllm:generation_tokens_total"))
        return counters

    def probe_tokens(self) -> float:
        text = httpx.get(f"{self.record.gateway_url}/metrics", timeout=5.0).text
        return sum_series(parse_samples(text), "fleet_gateway_probe_tokens_total")

    def probe_share(self) -> float | None:
        text = httpx.get(f"{self.record.controller_url}/metrics", timeout=5.0).text
        values = [s.value for s in parse_samples(text).get("fleet_canary_probe_share", [])]
        return values[0] if values else None


class ShareSampler:
    """Every 10 s, on a thread: fleet_canary_probe_share, and the engines' served-token counters, summed as
    increments so that an engine restarted by a drill (its counters start again at 0) or scaled away after one
    still counts what it served."""

    def __init__(self, bench: Bench):
        self.bench, self.samples = bench, []
        self.engine_tokens = 0.0
        self._last: dict[str, float] | None = None  # None until the first reading
        self._lock = threading.Lock()  # the sampling thread and the run's end both read
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "ShareSampler":
        self.observe_engines()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
        self.observe_engines()

    def observe_engines(self) -> None:
        try:
            counters = self.bench.engine_counters()
        except httpx.HTTPError:
            return
        with self._lock:
            if self._last is None:
                self._last = counters
                return
            for name, value in counters.items():
                last = self._last.get(name, 0.0)  # an engine started since: all it served
                self.engine_tokens += value - last if value >= last else value  # a restart: counted from 0
                self._last[name] = value

    def _loop(self) -> None:
        while not self._stop.wait(10.0):
            try:
                value = self.bench.probe_share()
            except httpx.HTTPError:
                continue
            if value is not None:
                self.samples.append(value)
            self.observe_engines()


# --- phases ---------------------------------------------------------------------------------------------------


def clean_run(bench: Bench) -> dict[str, Any]:
    log(f"clean run: {bench.args.clean_s:g}s with nothing wrong")
    first = bench.last_event_id()
    start = time.monotonic()
    time.sleep(bench.args.clean_s)
    alerts = bench.alerts_since(first)
    return {"seconds": time.monotonic() - start, "false_alarms": len(alerts),
            "alerts": [e.message for e in alerts]}


def deploy_bad_class(bench: Bench, key: str) -> tuple[str, float]:
    """The class deployed (one engine, weight 0) and when its engine became ready (time.monotonic)."""
    spec = {**bench.api.get_class(bench.a).spec, **BAD_CLASSES[key]}
    name = f"{bench.a.split('@')[0]}-{key.lower()}"
    ref = bench.api.apply_class(name, spec, reason=f"canary benchmark: {key}").ref
    bench.api.set_deployment(name, ref, replicas=1, reason="canary benchmark")
    if bench.wait(lambda: bench.ready(ref), 600.0, every_s=0.5) is None:
        raise RuntimeError(f"no engine of {ref} became ready")
    return ref, time.monotonic()


def names_class(event: Any, ref: str) -> bool:
    """An alert against `ref`: its own pinned stream, or the production stream blaming it."""
    return (event.kind == "pinned" and event.class_ref == ref) or (event.kind == "production" and ref in event.message)


def misroute(bench: Bench, to: str, fraction: float, limit_s: float, label: str, first: int, ready_at: float) -> dict[str, Any]:
    """Runs until the production stream blames `to` (or `limit_s`): the first alert naming the class may come
    from its own pinned stream, even before the drill (a wrong class is caught at deploy, before traffic)."""
    log(f"misroute {fraction:.0%} to {to} ({label}), up to {limit_s:g}s")
    started, started_at = time.monotonic(), datetime.now(timezone.utc)
    bench.api.start_misroute_drill(bench.model, to, fraction, limit_s + 120, reason=f"canary benchmark: {label}")
    seen: dict[str, tuple[float, Any]] = {}  # "any" / "production" -> (when, the alert)

    def production_blamed() -> bool:
        for event in bench.alerts_since(first):
            if names_class(event, to):
                seen.setdefault("any", (time.monotonic(), event))
            if event.kind == "production" and names_class(event, to):
                seen.setdefault("production", (time.monotonic(), event))
        return "production" in seen

    try:
        bench.wait(production_blamed, limit_s, every_s=1.0)
    finally:
        bench.api.stop_all_drills(reason="canary benchmark: drill over")
    first_alert = seen.get("any")
    production = seen.get("production")
    result = {"label": label, "to": to, "fraction": fraction,
              "detect_s": max(0.0, first_alert[0] - started) if first_alert else None,
              "since_ready_s": first_alert[0] - ready_at if first_alert else None,
              "stream": first_alert[1].kind if first_alert else None,
              "alert": first_alert[1].message if first_alert else None,
              "production_detect_s": production[0] - started if production else None,
              "production_alert": production[1].message if production else None,
              "drill_s": time.monotonic() - started,
              "probes": bench.probe_log(to, started_at - timedelta(seconds=started - ready_at))}
    result["recover_s"] = bench.wait(bench.recovered, bench.args.recover_s)
    log(f"  first alert after {result['detect_s']}s ({result['stream']}); production after "
        f"{result['production_detect_s']}s; recovered after {result['recover_s']}s")
    return result


def misroutes(bench: Bench) -> list[dict[str, Any]]:
    results = []
    for key in bench.args.classes.split(","):
        first = bench.last_event_id()
        ref, ready_at = deploy_bad_class(bench, key)
        results.append(misroute(bench, ref, 0.15, bench.args.drill_s, key, first, ready_at))
        bench.api.set_deployment(ref.split("@")[0], ref, replicas=0, reason="canary benchmark: done")
    return results


def plants(bench: Bench) -> list[dict[str, Any]]:
    results = []
    for fault in bench.args.faults.split(","):
        engine = bench.ready(bench.a)[0]
        first = bench.last_event_id()
        log(f"plant {fault} in {engine}, up to {bench.args.drill_s:g}s")
        started, started_at = time.monotonic(), datetime.now(timezone.utc)
        bench.api.start_plant_drill(engine, fault, bench.args.drill_s + 300, reason=f"canary benchmark: {fault}")
        found: list[Any] = []
        try:
            def alarmed() -> bool:
                found[:] = [e for e in bench.alerts_since(first) if engine in e.message]
                return bool(found)

            detected = bench.wait(alarmed, bench.args.drill_s)
        finally:
            bench.api.stop_all_drills(reason="canary benchmark: drill over")
        result = {"fault": fault, "engine": engine, "detect_s": detected, "alert": found[0].message if found else None,
                  "stream": found[0].kind if found else None, "drill_s": time.monotonic() - started,
                  "probes": bench.probe_log(bench.a, started_at, engine)}
        result["recover_s"] = bench.wait(lambda: len(bench.ready(bench.a)) == bench.args.nodes and bench.recovered(),
                                         bench.args.recover_s)
        log(f"  detected after {detected}s; recovered after {result['recover_s']}s")
        results.append(result)
    return results


def fractions(bench: Bench) -> list[dict[str, Any]]:
    """The production stream's detection is what counts here (the class's own pinned stream would name it
    at any fraction)."""
    first = bench.last_event_id()
    ref, ready_at = deploy_bad_class(bench, "LONG")
    results = [misroute(bench, ref, float(f), bench.args.fraction_s, f"LONG at {float(f):.0%}", first, ready_at)
               for f in bench.args.fractions.split(",")]
    bench.api.set_deployment(ref.split("@")[0], ref, replicas=0, reason="canary benchmark: done")
    return results


# --- the run --------------------------------------------------------------------------------------------------


def start_fleet(args: argparse.Namespace, state_dir: Path) -> Any:
    from fleetctl.localfleet import UpOptions, up

    options = UpOptions(state_dir=state_dir, nodes=args.nodes, model=args.model, controller_port=0, gateway_port=0,
                        engine_port_base=random.randrange(20_000, 40_000, 1_000), ready_timeout_s=600.0)
    return up(options, progress=log)


def measure(args: argparse.Namespace, record: Any) -> dict[str, Any]:
    bench = Bench(record, args)
    bench.api.set_traffic(bench.model, {bench.a: 100}, reason="canary benchmark: all on A")
    blocks = BlockText(reference_tokenizer_dir(), args.block_tokens)
    requests = build_requests(blocks, args.block_tokens, args.max_prompt_tokens, args.max_tokens, limit=4000)
    offsets = arrival_offsets(load_mooncake(TRACE)[:4000], args.rps, "steady")
    traffic = Traffic([record.gateway_url], bench.model, requests, offsets).start()
    sampler = ShareSampler(bench).start()
    report: dict[str, Any] = {"benchmark": "canary", "command": "benchmarks/canary.py " + " ".join(sys.argv[1:]),
                              "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                              "machine": {"platform": platform.platform(), "cpus": os.cpu_count()}}
    try:
        log(f"recording the reference of {bench.a} ({args.golden})")
        recorded = time.monotonic()
        bench.cli("canary", "record", "--class", bench.a, "--golden", args.golden, "--gateway", record.gateway_url,
                  "--repetitions", "8", "--conditions", "1,4", "-o", "json")
        report["record_s"] = time.monotonic() - recorded
        report["healthy_after_s"] = bench.wait(lambda: (s := bench.production()) is not None and s.verdict == "healthy",
                                               900.0)
        tokens_before, probes_before, measured = sampler.engine_tokens, bench.probe_tokens(), time.monotonic()
        phases = {"clean": clean_run, "misroute": misroutes, "plant": plants, "fraction": fractions}
        report["phase_share"] = {}
        for phase in args.phases.split(","):
            first_sample = len(sampler.samples)
            report[phase] = phases[phase](bench)
            taken = sampler.samples[first_sample:]
            report["phase_share"][phase] = {"mean": sum(taken) / len(taken) if taken else None,
                                            "max": max(taken, default=None)}
            write_json(args.out, {**report, "partial": True})  # what is done so far survives an interrupted run
        sampler.observe_engines()
        served, probed = sampler.engine_tokens - tokens_before, bench.probe_tokens() - probes_before
        report["cost"] = {"seconds": time.monotonic() - measured, "engine_tokens": served, "probe_tokens": probed,
                          "probe_share_of_served_tokens": probed / served if served else None,
                          "fleet_canary_probe_share_mean": (sum(sampler.samples) / len(sampler.samples)
                                                            if sampler.samples else None),
                          "fleet_canary_probe_share_max": max(sampler.samples, default=None)}
        report["streams"] = [s.model_dump(mode="json") for s in bench.api.canary_status(model=bench.model)]
    finally:
        sampler.stop()
        traffic.stop()
    report["traffic"] = {"requests": len(traffic.results), "failed": sum(1 for r in traffic.results if r.failed)}
    report["machine"]["loadavg_1m_end"] = os.getloadavg()[0]
    return report


def print_report(report: dict[str, Any]) -> None:
    rows = [{"drill": f"misroute 15% -> {r['label']}", "detect_s": r["detect_s"], "stream": r["stream"],
             "production_s": r["production_detect_s"], "recover_s": r["recover_s"]}
            for r in report.get("misroute", [])]
    rows += [{"drill": f"plant {r['fault']}", "detect_s": r["detect_s"], "stream": r.get("stream"),
              "production_s": None, "recover_s": r["recover_s"]}
             for r in report.get("plant", [])]
    rows += [{"drill": f"misroute {r['fraction']:.0%} -> LONG", "detect_s": r["detect_s"], "stream": r["stream"],
              "production_s": r["production_detect_s"], "recover_s": r["recover_s"]}
             for r in report.get("fraction", [])]
    print_table(rows, [("drill", "drill", ""), ("first alert after (s)", "detect_s", ".0f"),
                       ("by stream", "stream", ""), ("production stream after (s)", "production_s", ".0f"),
                       ("recovered after (s)", "recover_s", ".0f")])
    if "clean" in report:
        print(f"clean run: {report['clean']['seconds']:.0f} s, false alarms: {report['clean']['false_alarms']}")
    print(json.dumps(report.get("cost"), indent=2))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = measure_on_a_fleet(args, "fleet-canary-bench-", measure, start=start_fleet)
    write_json(args.out, report)
    print_report(report)


if __name__ == "__main__":
    main()
