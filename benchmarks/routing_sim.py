"""Routing past four engines, simulated: the gateway's scorer vs a radix-tree cache_aware router (the peers'
policy) vs round robin, on every workload shape, at 16 and 64 independent engines (fleetctl/sim/routing.py).

    .venv/bin/python benchmarks/routing_sim.py [--engines 16,64] [--load 0.6] [--duration 60]

Each shape (benchmarks/workloads) is generated with its arrival rate scaled so that the fleet's prefill servers
would be busy `--load` of the time without any cache hit (prompt tokens per second over the engines' prefill
throughput, `--prefill-tokens-per-s` each), over `--duration` seconds of arrivals (agent sessions start at the
rate that gives the same request rate, each lasting several turns). Per shape, engine count and policy: TTFT
p50/p90/p99, mean end-to-end time, prefix hit rate (prompt tokens) against the shape's ceiling, and the busiest
engine's share of requests. Deterministic (seeded shapes, no randomness in the simulator). Results: a table on
stdout and benchmarks/results/routing_sim.json.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, log, print_table, write_json  # noqa: E402
from benchmarks.workloads import SHAPES, reuse_ceiling, shapes  # noqa: E402
from fleetctl.sim.routing import (POLICIES, RoutingSimConfig, make_router, requests_from_rows, simulate,  # noqa: E402
                                  summarise)

OUT = RESULTS / "routing_sim.json"
TURNS_PER_SESSION = 4.5  # agent_sessions' default turns (3..6)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default="16,64")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--load", type=float, default=0.6, help="prefill utilisation with no cache hits")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    p.add_argument("--prefill-tokens-per-s", type=float, default=1000.0, help="each engine's prefill throughput")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--half-life-per-engine", default="",
                   help="also run the gateway with its recent-share half-life at these many requests per engine "
                        "(comma-separated; the gateway's default is 32 per engine)")
    p.add_argument("--hot-spot-damping", default="",
                   help="also run the gateway with its hot-spot guard's damping at these values (comma-separated; "
                        "the gateway's default is 0: a hot spot's cache is ignored)")
    p.add_argument("--shared-prefix-requests", default="",
                   help="also run the gateway pricing a shared prefix's miss as spread over its recent requests, "
                        "at these values of S (comma-separated; the gateway's default is 0: off)")
    p.add_argument("--warm-prefix-requests", default="",
                   help="also run the gateway warming a prefix that many recent requests began with on an idle "
                        "engine, at these values (comma-separated; the gateway's default is 0: off)")
    p.add_argument("--out", type=Path, default=OUT)
    return p.parse_args(argv)


def rows_for(shape: str, engines: int, args: argparse.Namespace, config: RoutingSimConfig) -> list[dict[str, Any]]:
    """The shape at the rate that loads the fleet's prefill to `--load` without hits."""
    generate = shapes()[shape]
    probe = generate(seed=args.seed)  # the shape's own mean prompt, to size the rate
    mean_tokens = sum(min(len(r["hash_ids"]), config.max_prompt_blocks) for r in probe) / len(probe) * config.block_tokens
    rps = args.load * engines * config.prefill_tokens_per_s / mean_tokens
    requests = max(1, round(rps * args.duration))
    if shape == "agent":
        sessions = max(1, round(requests / TURNS_PER_SESSION))
        return generate(seed=args.seed, sessions=sessions, sessions_per_s=rps / TURNS_PER_SESSION)
    return generate(seed=args.seed, requests=requests, rps=rps)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.time()
    rows_out = []
    for shape in [s.strip() for s in args.shapes.split(",") if s.strip()]:
        for engines in [int(n) for n in args.engines.split(",") if n.strip()]:
            config = RoutingSimConfig(engines=engines, prefill_tokens_per_s=args.prefill_tokens_per_s)
            rows = rows_for(shape, engines, args, config)
            requests = requests_from_rows(rows, config)
            ceiling = reuse_ceiling([{**r, "hash_ids": r["hash_ids"][: config.max_prompt_blocks]} for r in rows])
            variants = [(policy, config) for policy in POLICIES]
            variants += [(f"gateway hl {per}/engine", replace(config, share_half_life_requests_per_engine=float(per)))
                         for per in [p.strip() for p in args.half_life_per_engine.split(",") if p.strip()]]
            variants += [(f"gateway damping {d}", replace(config, scorer=replace(config.scorer, hot_spot_damping=float(d))))
                         for d in [d.strip() for d in args.hot_spot_damping.split(",") if d.strip()]]
            variants += [(f"gateway shared {v}", replace(config, scorer=replace(config.scorer, shared_prefix_requests=float(v))))
                         for v in [v.strip() for v in args.shared_prefix_requests.split(",") if v.strip()]]
            variants += [(f"gateway warm {v}", replace(config, warm=replace(config.warm, min_prefix_requests=float(v))))
                         for v in [v.strip() for v in args.warm_prefix_requests.split(",") if v.strip()]]
            for label, variant in variants:
                t0 = time.time()
                router = make_router(label.split(" ")[0], variant)
                summary = summarise(simulate(requests, router, variant), engines)
                rows_out.append({"shape": shape, "engines": engines, "policy": label, "ceiling": ceiling,
                                 **summary, "sim_wall_s": time.time() - t0})
                log(f"{shape} x{engines} {label}: p90 {summary['ttft_p90_s']:.3f}s hit {summary['hit_rate']:.3f}")
    for row in rows_out:  # against the best other policy of the same shape and size
        others = [r for r in rows_out if (r["shape"], r["engines"]) == (row["shape"], row["engines"])
                  and r["policy"].split(" ")[0] != row["policy"].split(" ")[0]]  # gateway variants are not "others"
        row["p90_vs_best_other"] = row["ttft_p90_s"] / min(r["ttft_p90_s"] for r in others) if others else None
    report = {"benchmark": "routing_sim", "command": "benchmarks/routing_sim.py " + " ".join(sys.argv[1:]),
              "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "sim": asdict(RoutingSimConfig()), "machine": {"platform": platform.platform()}, "rows": rows_out,
              "wall_s": time.time() - started}
    write_json(args.out, report)
    print_table(rows_out, [("shape", "shape", ""), ("engines", "engines", "d"), ("policy", "policy", ""),
                           ("TTFT p50 s", "ttft_p50_s", ".3f"), ("p90 s", "ttft_p90_s", ".3f"),
                           ("p99 s", "ttft_p99_s", ".3f"), ("e2e mean s", "e2e_mean_s", ".3f"),
                           ("hit", "hit_rate", ".3f"), ("ceiling", "ceiling", ".3f"),
                           ("busiest", "busiest_share", ".3f"), ("p90/best other", "p90_vs_best_other", ".2f")])


if __name__ == "__main__":
    main()
