"""P:D rebalancing on a live local fleet: what a role flip costs, and that flips drop nothing.

    .venv/bin/python benchmarks/pd.py [--model smollm2|tiny] [--engines 4] [--rps 1.0]

A local fleet on loopback (fleetctl/localfleet: a controller on SQLite, two agents, the gateway) with the
default deployment scaled to `--engines` mixed engines. Steady traffic from
../shared/traces/mooncake_conversation.jsonl (benchmarks/rollout_traffic.py) goes through the gateway from
start to end. Then:

1. **Mixed -> P/D**: `pd rebalance --prefill N/2 --decode N/2 --mixed 0 --apply`: every engine flips once.
2. **Baseline**: `--baseline-s` of steady traffic on the P/D split; its TTFT p99.
3. **One flip**: `pd rebalance --prefill N/2-1 --decode N/2+1 --apply`; per flip, the time from the decision
   (the flip_started event) to the new engine serving (flip_done: ready, routed by every gateway), and the
   TTFT p99 of the requests sent during it against the baseline's.
Requests dropped: every request sent from the first rebalance to the end that failed (non-200, transport
error, in-band error) or was cut. Run it alone on an idle machine. Results: stdout and
benchmarks/results/pd.json. The planner against fixed ratios and a threshold autoscaler is benchmarks/pd_sim.py.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, BlockText, load_mooncake, log, percentile, reference_tokenizer_dir, wait, write_json  # noqa: E402,E501
from benchmarks.rollout import measure_on_a_fleet, traffic_summary  # noqa: E402
from benchmarks.rollout_traffic import TRACE, Traffic, arrival_offsets, build_requests  # noqa: E402

OUT = RESULTS / "pd.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/pd.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--rps", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-prompt-tokens", type=int, default=128)
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--baseline-s", type=float, default=60.0)
    p.add_argument("--table-refresh-s", type=float, default=None)
    p.add_argument("--heartbeat-s", type=float, default=1.0)
    p.add_argument("--out", type=Path, default=OUT)
    return p.parse_args(argv)


def rebalance(api: Any, model: str, prefill: int, decode: int, mixed: int | None,
              reason: str = "benchmarks/pd.py") -> Any:
    started = api.pd_rebalance(model, prefill, decode, mixed=mixed, apply=True, baseline_s=0, ttft_slo_s=120.0,
                               itl_slo_s=10.0, reason=reason)
    assert started.rebalance is not None, started.preview
    return wait(lambda: (v := api.get_rebalance(started.rebalance.id)).phase in ("completed", "stopped") and v,
                900, f"rebalance {started.rebalance.id}", every_s=0.5)


def flip_spans(view: Any) -> list[dict[str, Any]]:
    """Per flip: the decision-to-serving seconds, from the rebalance's events (wall clock)."""
    started = [datetime.fromisoformat(e.at) for e in view.events if e.event == "flip_started"]
    done = [datetime.fromisoformat(e.at) for e in view.events if e.event == "flip_done"]
    return [{"engine": f.engine, "from": f.from_role, "to": f.to_role, "seconds": (d - s).total_seconds(),
             "started_at": s.timestamp(), "done_at": d.timestamp()}
            for f, s, d in zip(view.flips, started, done)]


def ttft_p99_between(traffic: Traffic, start_wall: float, end_wall: float, offset: float) -> tuple[float, int]:
    results = [r for r in traffic.between(start_wall - offset, end_wall - offset) if not r.failed and not r.cut]
    return percentile([r.ttft_s for r in results], 99), len(results)


def measure(args: argparse.Namespace, record: Any) -> dict[str, Any]:
    from fleetctl.client import ControllerClient

    api = ControllerClient(record.controller_url, Path(record.token_file).read_text().strip(), timeout=10.0)
    model = record.served_model
    api.set_deployment("local", record.class_ref, args.engines, reason="benchmarks/pd.py")
    wait(lambda: sum(e.state == "ready" for e in api.list_engines()) >= args.engines, 900, "the engines")
    blocks = BlockText(reference_tokenizer_dir(), args.block_tokens)
    requests = build_requests(blocks, args.block_tokens, args.max_prompt_tokens, args.max_tokens, limit=4000)
    offsets = arrival_offsets(load_mooncake(TRACE)[:4000], args.rps, "steady")
    traffic = Traffic([record.gateway_url], model, requests, offsets).start()
    offset = time.time() - time.monotonic()  # wall clock = monotonic + offset (events carry wall-clock times)
    try:
        time.sleep(10)
        first_sent = time.monotonic()
        half = args.engines // 2
        log(f"mixed -> {half}P:{half}D")
        to_pd = rebalance(api, model, half, args.engines - half, 0)
        time.sleep(10)
        log(f"baseline: {args.baseline_s:g} s of traffic on {half}P:{args.engines - half}D")
        base_start = time.time()
        time.sleep(args.baseline_s)
        base_p99, base_n = ttft_p99_between(traffic, base_start, time.time(), offset)
        log(f"one flip: -> {half - 1}P:{args.engines - half + 1}D")
        one = rebalance(api, model, half - 1, args.engines - half + 1, None)
        time.sleep(5)
    finally:
        traffic.stop()
    spans = flip_spans(to_pd) + flip_spans(one)
    last = spans[-1]
    during_p99, during_n = ttft_p99_between(traffic, last["started_at"], last["done_at"], offset)
    sent = traffic.between(first_sent, time.monotonic())
    summary = traffic_summary(sent)
    return {
        "machine": platform.node(), "date": time.strftime("%Y-%m-%d"), "model": args.model, "engines": args.engines,
        "rps": args.rps, "to_pd": {"phase": to_pd.phase, "flips": len(to_pd.flips)},
        "one_flip": {"phase": one.phase, "flips": len(one.flips)},
        "flips": spans, "flip_s_mean": sum(s["seconds"] for s in spans) / len(spans),
        "flip_s_max": max(s["seconds"] for s in spans),
        "baseline": {"ttft_p99_s": base_p99, "requests": base_n},
        "during_last_flip": {"ttft_p99_s": during_p99, "requests": during_n,
                             "ratio": during_p99 / base_p99 if base_p99 else None},
        "traffic": summary,
    }


def print_report(report: dict[str, Any]) -> None:
    for span in report["flips"]:
        print(f"flip {span['engine']:<18} {span['from']:>7} -> {span['to']:<7} {span['seconds']:6.1f} s decision to serving")
    t, b, d = report["traffic"], report["baseline"], report["during_last_flip"]
    print(f"flips: mean {report['flip_s_mean']:.1f} s, max {report['flip_s_max']:.1f} s")
    print(f"TTFT p99: baseline {b['ttft_p99_s']:.3f} s ({b['requests']} requests), during the last flip "
          f"{d['ttft_p99_s']:.3f} s ({d['requests']} requests): {d['ratio']:.2f}x")
    print(f"requests failed or cut from the first rebalance on: {t['failed'] + t['cut']} of {t['requests']}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = measure_on_a_fleet(args, "fleet-pd-bench-", measure)
    write_json(args.out, report)
    print_report(report)


if __name__ == "__main__":
    main()
