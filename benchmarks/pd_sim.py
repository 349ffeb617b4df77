"""The P:D planner in the simulator at scale: goodput within SLO with the planner (fleetctl.pd.planner, run
unchanged through fleetctl/sim/pd_control.py) vs the best fixed ratio chosen in hindsight vs a naive
utilisation-threshold autoscaler, and the flips each made; on the Azure 2023 code trace then the conv trace
(the prompt/output mix shifts from long prompts and short answers to the reverse).

    .venv/bin/python benchmarks/pd_sim.py [--engines 64,1024] [--phase-s 600] [--classes reference,h100]
                                          [--fleet-model fluid|event]

The simulator is deterministic (seeded Poisson arrivals with the traces' joint length distribution), so its
figures do not depend on the machine's load; only its run time does. `--fleet-model fluid` (the default)
runs the coarse fluid fleet (fleetctl/sim/fluid.py: decode as a rate, events per request rather than per
decode step), which makes 1,024 engines a matter of seconds per run; `event` runs the event-level fleet,
every decode step an event (hours per run at 1,024 engines). On the same split the two agree on goodput
to within a percent (tests/sim/test_fluid.py; the 64-engine rows of docs/benchmarks.md show both).

Engine classes (where each constant comes from):
- `reference`: SmolLM2-135M on one CPU core (fleetctl.sim.REFERENCE_SMOLLM2_CPU, calibrated with
  benchmarks/admission.py --calibrate); trace lengths scaled down 8x (prompts) and 4x (outputs) so a CPU
  engine serves them; SLOs TTFT 10 s, ITL 0.3 s.
- `h100`: Llama-3.1-8B BF16 on one H100 under vLLM, from published figures, not measured here: decode ~12,500
  output tok/s at batch 128 (third-party vLLM benchmarks collected at morphllm.com/vllm-benchmarks, 2026) and
  a batch-1 step of ~7 ms (16 GB of weights read per step at 3.35 TB/s is 4.8 ms, plus overhead), so a step is
  7 ms + 0.025 ms per sequence; prefill 20,000 tok/s (~35% MFU of the H100's 989 dense BF16 TFLOPS at 2 x 8e9
  FLOP per token); a KV pool of 450,000 tokens (~60 GB at 128 KiB per token). Trace lengths as recorded;
  SLOs TTFT 2 s, ITL 50 ms.
Each phase's arrival rate puts the fleet at `--utilisation` of its capacity at that phase's best split.
Flips: restart 20 s (reference) / 60 s (h100: weights load); the planner flips up to engines/16 at once.
The planner and the threshold autoscaler start at the best fixed split, so what they show is what adapting
to the shift gains or loses against staying there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetctl.pd.planner import PlannerSettings  # noqa: E402
from fleetctl.sim import REFERENCE_SMOLLM2_CPU, EngineConstants, FleetShape, RequestSpec, admit_all_policy, simulate  # noqa: E402
from fleetctl.sim.fluid import simulate_fluid  # noqa: E402
from fleetctl.sim.pd_control import PlannerControl, ThresholdControl, sim_profile  # noqa: E402
from fleetctl.sim.results import goodput as within_slo  # noqa: E402
from fleetctl.sim.workload import (  # noqa: E402
    TRACES_DIR, LengthScaling, load_azure_trace, one_after_another, sampled_workload,
)

H100_LLAMA_8B = EngineConstants(prefill_tokens_per_s=20_000.0, decode_step_base_s=0.007,
                                decode_step_per_seq_s=0.000025, source="published H100 figures (see module doc)")
STEADY_AFTER_S = 120.0  # a phase's load counts as steady this long after it began


@dataclass(frozen=True)
class EngineClass:
    name: str
    constants: EngineConstants
    scaling: LengthScaling
    max_num_seqs: int
    kv_tokens: int  # KV pool per decode engine
    ttft_slo_s: float
    itl_slo_s: float
    restart_s: float


CLASSES = {
    "reference": EngineClass("reference", REFERENCE_SMOLLM2_CPU, LengthScaling(8.0, 4.0), 16, 11_648, 10.0, 0.3, 20.0),
    "h100": EngineClass("h100", H100_LLAMA_8B, LengthScaling(1.0, 1.0), 256, 450_000, 2.0, 0.05, 60.0),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="64,1024", help="fleet sizes, comma-separated")
    parser.add_argument("--classes", default="reference,h100")
    parser.add_argument("--phase-s", type=float, default=600.0, help="seconds of each trace")
    parser.add_argument("--utilisation", type=float, default=0.6)
    parser.add_argument("--grid", type=int, default=12, help="fixed ratios tried before refining around the best")
    parser.add_argument("--floor-decode", type=int, default=1,
                        help="the planner's decode floor (`fleetctl pd mode --floor-decode`)")
    parser.add_argument("--fleet-model", choices=("fluid", "event"), default="fluid",
                        help="fluid: decode as a rate, fast at 1,024 engines; event: every decode step an event")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/pd_sim.json"))
    return parser.parse_args(argv)


def workload(engine: EngineClass, engines: int, phase_s: float, utilisation: float) -> list[RequestSpec]:
    code = load_azure_trace(TRACES_DIR / "azure_llm_2023_code.csv")
    conv = load_azure_trace(TRACES_DIR / "azure_llm_2023_conv.csv")
    profile = sim_profile(engine.constants, engine.max_num_seqs, engine.itl_slo_s)

    def rate(rows) -> float:
        sample = [engine.scaling.request(0, 0.0, r) for r in rows]
        isl = statistics.mean(r.prompt_tokens for r in sample)
        osl = statistics.mean(r.output_tokens for r in sample)
        per_request = isl / profile.prefill_tokens_per_s + osl * engine.itl_slo_s / profile.decode_slots
        return utilisation * engines / per_request

    first = sampled_workload(code, rate(code), phase_s, engine.scaling, seed=1)
    return one_after_another(first, sampled_workload(conv, rate(conv), phase_s, engine.scaling, seed=2), phase_s)


def goodput(result, work: list[RequestSpec], engine: EngineClass) -> float:
    """The fraction of all requests completed within both of the class's SLOs (TTFT, and mean ITL)."""
    return within_slo(result, work, engine.ttft_slo_s, engine.itl_slo_s)


def run(engine: EngineClass, engines: int, prefill: int, work: list[RequestSpec], phase_s: float, control=None,
        fleet_model: str = "fluid") -> Any:
    shape = FleetShape(prefill, engines - prefill, engine.constants, max_num_seqs=engine.max_num_seqs,
                       kv_capacity_tokens=engine.kv_tokens)
    if fleet_model == "fluid":
        return simulate_fluid(work, shape, 2 * phase_s, sample_every_s=1.0, horizon_s=2 * phase_s + 120.0,
                              control=control)
    return simulate(work, shape, admit_all_policy(), 2 * phase_s, sample_every_s=1.0,
                    horizon_s=2 * phase_s + 120.0, control=control)


def best_fixed(engine: EngineClass, engines: int, work, phase_s: float, grid: int,
               fleet_model: str) -> tuple[int, float, int]:
    """(prefill count, goodput, runs) of the best fixed split: a grid, then every count around its best.
    When the grid's best has every request within SLO (goodput 1), nothing beats it: no refining."""
    tried: dict[int, float] = {}

    def score(p: int) -> float:
        if p not in tried:
            tried[p] = goodput(run(engine, engines, p, work, phase_s, fleet_model=fleet_model), work, engine)
        return tried[p]

    step = max(1, (engines - 1) // grid)
    for p in range(1, engines, step):
        score(p)
    best = max(tried, key=lambda p: (tried[p], -abs(p - engines / 2)))
    radius = step
    while radius > 1 and tried[best] < 1.0:
        radius = max(1, radius // 3)
        for p in range(max(1, best - 2 * radius), min(engines - 1, best + 2 * radius) + 1, radius):
            score(p)
        best = max(tried, key=lambda p: (tried[p], -abs(p - engines / 2)))
    return best, tried[best], len(tried)


def per_5min_steady(times_s: list[float], phase_s: float) -> float:
    """Events per 5 minutes of steady load: the ones later than STEADY_AFTER_S into a phase."""
    steady = [t for t in times_s if (t % phase_s) >= STEADY_AFTER_S]
    steady_s = 2 * (phase_s - STEADY_AFTER_S)
    return len(steady) / steady_s * 300.0


def measure(engine: EngineClass, engines: int, phase_s: float, utilisation: float, grid: int,
            fleet_model: str, floor_decode: int = 1) -> dict[str, Any]:
    started = time.monotonic()
    work = workload(engine, engines, phase_s, utilisation)
    fixed_p, fixed_goodput, runs = best_fixed(engine, engines, work, phase_s, grid, fleet_model)
    settings = PlannerSettings(ttft_slo_s=engine.ttft_slo_s, itl_slo_s=engine.itl_slo_s, cooldown_s=120.0,
                               floor_decode=floor_decode)
    planner = PlannerControl(settings, sim_profile(engine.constants, engine.max_num_seqs, engine.itl_slo_s),
                             engine.restart_s, parallel=max(1, engines // 16))
    start_p = fixed_p  # the adaptive controllers start where the best fixed split is: what they gain is adapting
    planner_goodput = goodput(run(engine, engines, start_p, work, phase_s, planner, fleet_model), work, engine)
    threshold = ThresholdControl(engine.restart_s)
    threshold_goodput = goodput(run(engine, engines, start_p, work, phase_s, threshold, fleet_model), work, engine)
    return {
        "class": engine.name, "engines": engines, "fleet_model": fleet_model, "requests": len(work),
        "phase_s": phase_s, "utilisation": utilisation, "floor_decode": floor_decode,
        "start_split": f"{start_p}P:{engines - start_p}D",
        "best_fixed": {"prefill": fixed_p, "decode": engines - fixed_p, "goodput": fixed_goodput, "runs": runs},
        # a ratio change is one decision (a rebalance, which may flip several engines); the threshold
        # autoscaler decides one engine at a time, so for it the two counts are the same
        "planner": {"goodput": planner_goodput, "flips": len(planner.flips), "ratio_changes": len(planner.changes),
                    "steady_flips_per_5min": per_5min_steady([f.at_s for f in planner.flips], phase_s),
                    "steady_changes_per_5min": per_5min_steady(planner.changes, phase_s),
                    "vs_best_fixed": planner_goodput / fixed_goodput if fixed_goodput else None},
        "threshold": {"goodput": threshold_goodput, "flips": len(threshold.flips),
                      "steady_flips_per_5min": per_5min_steady([f.at_s for f in threshold.flips], phase_s)},
        "wall_s": time.monotonic() - started,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = []
    for name in args.classes.split(","):
        for engines in (int(n) for n in args.engines.split(",")):
            result = measure(CLASSES[name], engines, args.phase_s, args.utilisation, args.grid, args.fleet_model,
                             args.floor_decode)
            results.append(result)
            p, t, f = result["planner"], result["threshold"], result["best_fixed"]
            print(f"{name:>9} x{engines:<5} {args.fleet_model:<5} best fixed {f['prefill']}P:{f['decode']}D "
                  f"{f['goodput']:.3f} | planner "
                  f"{p['goodput']:.3f} ({p['vs_best_fixed']:.2f}x, {p['flips']} flips in {p['ratio_changes']} changes, "
                  f"{p['steady_flips_per_5min']:.2f} flips and {p['steady_changes_per_5min']:.2f} changes/5min steady) "
                  f"| threshold {t['goodput']:.3f} ({t['flips']} flips, "
                  f"{t['steady_flips_per_5min']:.2f}/5min) [{result['wall_s']:.0f}s]", flush=True)
            # written after every result, so a run stopped early keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"utilisation": args.utilisation, "results": results}, indent=2))


if __name__ == "__main__":
    main()
