"""P:D control inside the simulator: the live planner, unchanged, and a naive baseline, each flipping the
simulated fleet's engines one at a time (Fleet.start_flip).

- `PlannerControl`: every `plan_every_s` it reads the engines' counters as engines report them
  (`readings`), feeds them to the same `LoadTracker` the controller uses, and calls the same
  `planner.plan` on the same kind of `Snapshot`; a recommended ratio is then reached one flip at a time,
  the cheapest engine first (`flips.next_flip`), as the controller's rebalance does. The cooldown counts
  from when the last rebalance reached its target.
- `ThresholdControl`: the utilisation-threshold autoscaler a team writes first: every interval, if one
  role is busier than `high` and the other idler than `low`, flip one engine toward the busy one. No
  prediction, no hysteresis beyond the two thresholds.
- `sim_profile`: the planner's EngineProfile from the simulator's engine constants (prefill tokens/s; the
  largest batch whose decode step stays within the ITL SLO, and that step's time), as `fleetctl pd profile`
  measures them on a live engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from fleetctl.pd.flips import EngineNow, next_flip
from fleetctl.pd.load import EngineReading, LoadTracker, ModelReading
from fleetctl.pd.planner import EngineProfile, Gates, PlannerSettings, Ratio, Recommendation, Snapshot, plan
from fleetctl.sim.engines import EngineConstants
from fleetctl.sim.fleet import Fleet

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)  # simulated second 0, for the tracker's and planner's clocks
MODEL = "sim"


@dataclass(frozen=True)
class FlipRecord:
    at_s: float
    engine: str
    from_role: str
    to_role: str


def sim_profile(constants: EngineConstants, max_num_seqs: int, itl_slo_s: float) -> EngineProfile:
    per_seq = constants.decode_step_per_seq_s
    slots = max_num_seqs if per_seq <= 0 else math.floor((itl_slo_s - constants.decode_step_base_s) / per_seq)
    slots = max(1, min(slots, max_num_seqs))
    return EngineProfile(constants.prefill_tokens_per_s, float(slots), f"simulator constants ({constants.source})",
                         decode_itl_s=constants.step_s(slots))


def readings(fleet: Fleet) -> ModelReading:
    """The fleet's engines as the agents would report their counters (engine.contract.EngineMetrics)."""
    engines = [EngineReading(e.name, "prefill", {"prompt_tokens": float(e.prompt_tokens_done), "generation_tokens": 0.0,
                                                 "prefix_cache_hits": 0.0, "prefix_cache_queries": 0.0,
                                                 "ttft_seconds_count": float(e.prefilled)}, len(e.queue))
               for e in fleet.prefill]
    engines += [EngineReading(e.name, "decode", {"prompt_tokens": 0.0, "generation_tokens": float(e.generated_tokens),
                                                 "prefix_cache_hits": 0.0, "prefix_cache_queries": 0.0,
                                                 "ttft_seconds_count": float(e.started)}, len(e.waiting),
                                  len(e.running))
                for e in fleet.decode]
    return ModelReading(EPOCH + timedelta(seconds=fleet.now), tuple(engines))


def ratio(fleet: Fleet) -> Ratio:
    """Engines per role once the flips in flight are done: a draining or restarting engine counts in its
    new role."""
    moving = [to_role for to_role, _ in fleet.draining.values()] + fleet.joining
    prefill = sum(1 for e in fleet.prefill if e.name not in fleet.draining) + moving.count("prefill")
    decode = sum(1 for e in fleet.decode if e.name not in fleet.draining) + moving.count("decode")
    return Ratio(prefill, decode)


def flipping(fleet: Fleet) -> bool:
    return bool(fleet.draining or fleet.joining)


def engines_now(fleet: Fleet) -> list[EngineNow]:
    engines = [EngineNow(e.name, "prefill", True, e.length()) for e in fleet.prefill if e.name not in fleet.draining]
    engines += [EngineNow(e.name, "decode", True, len(e.running) + len(e.waiting) + len(e.bound),
                          e.kv_used() / e.kv_capacity) for e in fleet.decode if e.name not in fleet.draining]
    return engines


@dataclass
class PlannerControl:
    settings: PlannerSettings
    profile: EngineProfile
    restart_s: float  # seconds a flipped engine takes to serve in its new role
    plan_every_s: float = 10.0
    parallel: int = 1  # flips in flight at once (1: as `fleetctl pd rebalance`)
    tracker: LoadTracker = field(default_factory=LoadTracker)
    flips: list[FlipRecord] = field(default_factory=list)
    changes: list[float] = field(default_factory=list)  # when it decided to change the ratio (one per rebalance)
    recommendations: list[tuple[float, Recommendation]] = field(default_factory=list)
    target: Ratio | None = None
    last_change_at: datetime | None = None
    previous: tuple[Ratio, datetime] | None = None  # the last recommendation and since when (the dwell)
    _last_plan_s: float = -math.inf

    def __call__(self, fleet: Fleet) -> None:
        if self.target is not None:
            self._toward_target(fleet)
        if fleet.now - self._last_plan_s < self.plan_every_s:
            return
        self._last_plan_s = fleet.now
        self.tracker.observe(MODEL, readings(fleet))
        loaded = self.tracker.load(MODEL)
        if loaded is None:
            return
        now = EPOCH + timedelta(seconds=fleet.now)
        rebalancing = "a rebalance" if self.target is not None else None
        snapshot = Snapshot(MODEL, ratio(fleet), loaded[0], self.profile,
                            Gates(rebalancing=rebalancing, last_change_at=self.last_change_at, previous=self.previous))
        rec = plan(snapshot, self.settings, now)
        self.previous = (rec.recommended, rec.since) if rec.since is not None else None
        self.recommendations.append((fleet.now, rec))
        if rec.action == "rebalance":
            self.target = rec.recommended
            self.changes.append(fleet.now)
            self._toward_target(fleet)

    def _toward_target(self, fleet: Fleet) -> None:
        while self.target is not None and len(fleet.draining) + len(fleet.joining) < self.parallel:
            current = ratio(fleet)
            if current == self.target:
                if not flipping(fleet):
                    self.target, self.last_change_at = None, EPOCH + timedelta(seconds=fleet.now)
                return
            flip = next_flip(engines_now(fleet), current, self.target)
            if flip is None:
                self.target = None
                return
            fleet.start_flip(flip.engine, flip.to_role, self.restart_s)
            self.flips.append(FlipRecord(fleet.now, flip.engine, flip.from_role, flip.to_role))


@dataclass
class ThresholdControl:
    restart_s: float
    every_s: float = 10.0
    high: float = 0.8
    low: float = 0.5
    floor: int = 1
    flips: list[FlipRecord] = field(default_factory=list)
    _last_s: float = -math.inf

    def __call__(self, fleet: Fleet) -> None:
        if fleet.now - self._last_s < self.every_s or flipping(fleet):
            return
        self._last_s = fleet.now
        prefill = [e for e in fleet.prefill if e.name not in fleet.draining]
        decode = [e for e in fleet.decode if e.name not in fleet.draining]
        busy_p = sum(1 for e in prefill if not e.idle()) / max(len(prefill), 1)
        busy_d = sum(len(e.running) + len(e.waiting) for e in decode) / max(sum(e.slots for e in decode), 1)
        if busy_p > self.high and busy_d < self.low and len(decode) > self.floor:
            engine, to_role = min(decode, key=lambda e: (len(e.running) + len(e.waiting), e.name)).name, "prefill"
        elif busy_d > self.high and busy_p < self.low and len(prefill) > self.floor:
            engine, to_role = min(prefill, key=lambda e: (e.length(), e.name)).name, "decode"
        else:
            return
        fleet.start_flip(engine, to_role, self.restart_s)
        self.flips.append(FlipRecord(fleet.now, engine, "decode" if to_role == "prefill" else "prefill", to_role))
