"""The P:D planner: `plan(snapshot, settings, now) -> Recommendation`, pure.

How it decides, for one model's prefill and decode engines (mixed engines are left as they are):

1. Prefill need, in engines: the predicted arrival rate times the prompt tokens that must be computed (a
   prefix-cache hit is prefill work not done), over what one engine computes per second within the TTFT
   SLO (its profile), times (1 + headroom). A prefill queue that would take longer than half the TTFT SLO
   to clear at the current count adds one engine (the reactive term: queue time is what a rate-based
   estimate misses in a burst).
2. Decode need, in engines: concurrent decoding sequences by Little's law (rate x output tokens x the ITL
   at full batch, the time each holds a slot: the profile's measured ITL at its decode slots, or the ITL
   SLO when it has none), or the sequences the decode engines were measured running when that is
   more (output lengths lag a shift in the mix), plus the slots that would drain the sequences waiting for
   one within `backlog_drain_s` (about one flip), over one engine's decode slots at the ITL SLO, times
   (1 + headroom). A backlog is planned for as work to clear, not as standing concurrency: sized as
   concurrency, a backlog built while decode was short asks for more decode engines than the steady load
   needs, and the prefill engines flipped for it starve the next requests (measured in
   benchmarks/pd_sim.py: 16P:48D where 37P:27D served the load).
   When the decode slots are full, handoffs waiting for one add one engine when the wait is longer than
   the ITL SLO (the wait is the queue over the rate slots free up at, which in steady state is the
   arrival rate). A handoff waiting while slots are free is placement or the engine's next step, not a
   shortage: at a low rate one such handoff in a reading looks far over the SLO, and bumping on it made
   the advice flicker between two ratios every few seconds.
3. A rebalance keeps the engine count. When the engines can cover both needs (each rounded up to whole
   engines, each role at least its floor), every prefill count in [ceil(prefill need), engines - ceil(decode
   need)] keeps both within capacity: the count stays if it is in that range, else it moves past the near
   edge by a quarter of the range: not onto the edge, where the next bit of noise would move it again (and
   a need that creeps up would ratchet it one engine at a time), and not to the middle, which overshoots
   and leaves the other role short when the mix shifts back (measured in benchmarks/pd_sim.py). The range
   itself is the hysteresis: noise that keeps both roles within capacity changes nothing.
4. When they cannot (overload), the engines are split in proportion to the two needs (DistServe's rule:
   P:D ~ prefill work / decode work), and the count moves only when the proportional split is more than
   `band` (< 0.5) engines beyond the half-engine around it, so noise around a boundary holds it steady.
5. A change is recommended but held (`blocked_by`) while the fleet is frozen, a rollout of the model is
   running, a rebalance is already under way, the `planner` flag is off, the last change was less than
   `cooldown_s` ago, or a change in this direction has been recommended for less than `dwell_s` (a burst
   that is over by the next plans moves nothing). The caller keeps the last recommendation and since when
   (`Gates.previous`, `Recommendation.since`).

Every step's figures are in `reasons`, as a line an operator can check by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

Action = Literal["hold", "rebalance"]


@dataclass(frozen=True)
class EngineProfile:
    """What one engine of a class revision does within the SLOs (`fleetctl pd profile`, or defaults)."""

    prefill_tokens_per_s: float  # uncached prompt tokens computed per second
    decode_slots: float  # sequences decoded at once within the ITL SLO
    source: str = "default"
    decode_itl_s: float | None = None  # the ITL measured at decode_slots; None: not measured, taken as the SLO


@dataclass(frozen=True)
class Load:
    """A model's load as observed, with the arrival rate already predicted (predict.py)."""

    arrival_rps: float  # predicted for the planning horizon
    mean_input_tokens: float
    mean_output_tokens: float
    measured_rps: float | None = None  # the rate seen last, for display
    prefix_hit_rate: float = 0.0  # 0..1 of prompt tokens found in the prefix cache
    prefill_queue: int = 0  # requests waiting for prefill, over the model's prefill engines
    decode_queue: int = 0  # requests waiting for a decode slot, over its decode engines
    decode_occupancy: float = 0.0  # sequences its decode engines held (running + waiting), as measured


@dataclass(frozen=True)
class Ratio:
    prefill: int
    decode: int
    mixed: int = 0

    def text(self) -> str:
        mixed = f" + {self.mixed} mixed" if self.mixed else ""
        return f"{self.prefill}P:{self.decode}D{mixed}"


@dataclass(frozen=True)
class Gates:
    """What may hold a change back, read from the store (or the simulator's state)."""

    frozen: bool = False
    rollout: str | None = None  # the running rollout of the model, in words
    rebalancing: str | None = None  # the rebalance under way, in words
    planner_enabled: bool = True  # the `planner` flag
    last_change_at: datetime | None = None
    previous: tuple[Ratio, datetime] | None = None  # the last recommended ratio, and since when


@dataclass(frozen=True)
class PlannerSettings:
    ttft_slo_s: float = 2.0
    itl_slo_s: float = 0.1
    headroom: float = 0.2  # plan for need x (1 + headroom)
    band: float = 0.3  # hysteresis, in engines, beyond half an engine
    floor_prefill: int = 1
    floor_decode: int = 1
    cooldown_s: float = 300.0  # at most one change of a model per this many seconds
    dwell_s: float = 20.0  # a recommended change must stand this long before it is acted on
    backlog_drain_s: float = 60.0  # plan decode slots to clear a decode backlog within this long


@dataclass(frozen=True)
class Snapshot:
    model: str
    current: Ratio
    load: Load
    profile: EngineProfile
    gates: Gates = field(default_factory=Gates)


@dataclass(frozen=True)
class Recommendation:
    model: str
    current: Ratio
    recommended: Ratio
    action: Action  # rebalance: recommended differs and nothing holds it back
    prefill_need: float  # engines' worth of prefill work, with headroom
    decode_need: float
    ideal_prefill: float  # the proportional split before hysteresis and rounding
    blocked_by: str | None  # why a differing recommendation is held
    reasons: tuple[str, ...]
    since: datetime | None = None  # since when this ratio has been recommended (for Gates.previous)

    @property
    def changes(self) -> bool:
        return self.recommended != self.current


def plan(snapshot: Snapshot, settings: PlannerSettings, now: datetime) -> Recommendation:
    current, load, profile = snapshot.current, snapshot.load, snapshot.profile
    if current.prefill + current.decode == 0:
        why = (f"served mixed-only ({current.mixed} mixed engines): the planner plans prefill and decode engines; "
               "`fleetctl pd rebalance MODEL --prefill N --decode M --mixed K` makes the model P/D")
        return Recommendation(snapshot.model, current, current, "hold", 0.0, 0.0, 0.0, None, (why,), now)
    prefill_need, prefill_why = _prefill_need(current, load, profile, settings)
    decode_need, decode_why = _decode_need(current, load, profile, settings)
    reasons = [prefill_why, decode_why]
    engines = current.prefill + current.decode
    if engines < settings.floor_prefill + settings.floor_decode:
        reasons.append(f"{engines} P/D engines cannot hold the floors ({settings.floor_prefill} prefill, "
                       f"{settings.floor_decode} decode): nothing to plan")
        return Recommendation(snapshot.model, current, current, "hold", prefill_need, decode_need,
                              float(current.prefill), None, tuple(reasons), now)
    ideal = _ideal_prefill(engines, prefill_need, decode_need, current, settings)
    prefill, split_why = _target_prefill(current.prefill, prefill_need, decode_need, ideal, engines, settings)
    reasons.append(split_why)
    recommended = Ratio(prefill, engines - prefill, current.mixed)
    since = _standing_since(snapshot.gates.previous, current, recommended, now)
    blocked = _blocked_by(snapshot.gates, settings, now, since) if recommended != current else None
    if recommended != current:
        reasons.append(f"-> {recommended.text()}" + (f", held: {blocked}" if blocked else ""))
    action: Action = "rebalance" if recommended != current and blocked is None else "hold"
    return Recommendation(snapshot.model, current, recommended, action, prefill_need, decode_need, ideal, blocked,
                          tuple(reasons), since)


def _prefill_need(current: Ratio, load: Load, profile: EngineProfile, settings: PlannerSettings) -> tuple[float, str]:
    computed = load.mean_input_tokens * (1.0 - min(max(load.prefix_hit_rate, 0.0), 1.0))
    work = load.arrival_rps * computed
    engines = work / profile.prefill_tokens_per_s if profile.prefill_tokens_per_s > 0 else 0.0
    need = engines * (1 + settings.headroom)
    capacity = profile.prefill_tokens_per_s * current.prefill
    verdict = "<" if capacity < work * (1 + settings.headroom) else ">="
    why = (f"prefill: {load.arrival_rps:.2f} req/s x {computed:.0f} uncached prompt tokens "
           f"({load.prefix_hit_rate:.0%} prefix hits) = {work:.0f} tok/s; {profile.prefill_tokens_per_s:.0f} tok/s/engine "
           f"x {current.prefill} = {capacity:.0f} {verdict} {work * (1 + settings.headroom):.0f} with "
           f"{settings.headroom:.0%} headroom -> {need:.2f} engines")
    if current.prefill > 0 and load.prefill_queue > 0 and profile.prefill_tokens_per_s > 0:
        clear_s = load.prefill_queue * computed / (current.prefill * profile.prefill_tokens_per_s)
        if clear_s > settings.ttft_slo_s / 2 and need < current.prefill + 1:
            need = float(current.prefill + 1)
            why += (f"; {load.prefill_queue} queued take {clear_s:.1f} s to clear > half the TTFT SLO "
                    f"({settings.ttft_slo_s:g} s) -> {need:.0f}")
    return need, why


def _decode_need(current: Ratio, load: Load, profile: EngineProfile, settings: PlannerSettings) -> tuple[float, str]:
    itl_s, itl_text = _planned_itl(profile, settings)
    slot_s = load.mean_output_tokens * itl_s  # how long a sequence holds a slot
    predicted = load.arrival_rps * slot_s
    running = max(0.0, load.decode_occupancy - load.decode_queue)
    backlog = load.decode_queue * slot_s / settings.backlog_drain_s if settings.backlog_drain_s > 0 else 0.0
    concurrent = max(predicted, running) + backlog
    slots = profile.decode_slots * current.decode
    engines = concurrent / profile.decode_slots if profile.decode_slots > 0 else 0.0
    need = engines * (1 + settings.headroom)
    verdict = "<" if slots < concurrent * (1 + settings.headroom) else ">="
    observed = f" (observed {running:.1f} running)" if running > predicted else ""
    if backlog > 0:
        observed += (f" + {load.decode_queue} waiting x {slot_s:.1f} s / {settings.backlog_drain_s:g} s "
                     f"to drain = {backlog:.1f}")
    why = (f"decode: {load.arrival_rps:.2f} req/s x {load.mean_output_tokens:.0f} output tokens x "
           f"{itl_text} = {predicted:.1f} concurrent{observed}; decode slots at ITL SLO "
           f"{profile.decode_slots:.0f}/engine x {current.decode} = {slots:.0f} {verdict} "
           f"{concurrent * (1 + settings.headroom):.1f} with headroom -> {need:.2f} engines")
    full = running >= profile.decode_slots * current.decode  # a handoff waiting beside free slots is not a shortage
    if current.decode > 0 and load.decode_queue > 0 and full:
        wait_s = load.decode_queue / load.arrival_rps if load.arrival_rps > 0 else math.inf
        if wait_s > settings.itl_slo_s and need < current.decode + 1:
            need = float(current.decode + 1)
            why += (f"; {load.decode_queue} handoffs wait ~{wait_s:.2f} s for a decode slot > the ITL SLO "
                    f"({settings.itl_slo_s:g} s) -> {need:.0f}")
    return need, why


def _planned_itl(profile: EngineProfile, settings: PlannerSettings) -> tuple[float, str]:
    """Seconds per output token of a sequence on a full decode engine: the ITL the profile measured at its
    decode slots when that is under the SLO (a batch capped by max_num_seqs runs faster than the SLO
    allows: on a GPU often several times), else the SLO itself."""
    measured = profile.decode_itl_s
    if measured is not None and 0 < measured < settings.itl_slo_s:
        return measured, f"{measured:.4g} s ITL at {profile.decode_slots:.0f} slots"
    return settings.itl_slo_s, f"{settings.itl_slo_s:g} s ITL SLO"


def _ideal_prefill(engines: int, prefill_need: float, decode_need: float, current: Ratio,
                   settings: PlannerSettings) -> float:
    total = prefill_need + decode_need
    ideal = engines * prefill_need / total if total > 0 else float(current.prefill)
    return min(max(ideal, float(settings.floor_prefill)), float(engines - settings.floor_decode))


def _target_prefill(prefill: int, prefill_need: float, decode_need: float, ideal: float, engines: int,
                    settings: PlannerSettings) -> tuple[int, str]:
    low = max(math.ceil(prefill_need - 1e-9), settings.floor_prefill)
    high = min(engines - math.ceil(decode_need - 1e-9), engines - settings.floor_decode)
    if low <= high:
        target = prefill if low <= prefill <= high else _into_range(prefill, low, high)
        verdict = "both fit: hold" if target == prefill else f"{prefill} -> {target} prefill"
        return target, (f"{engines} P/D engines cover both needs with {low}..{high} prefill "
                        f"(ceil {prefill_need:.2f} .. {engines} - ceil {decode_need:.2f}): {verdict}")
    band = min(settings.band, 0.45)  # below half an engine: an overload split never undercuts a fitting one
    floor_p, ceil_p = settings.floor_prefill, engines - settings.floor_decode
    lowest = min(max(_round(ideal - band), floor_p), ceil_p)
    highest = min(max(_round(ideal + band), floor_p), ceil_p)
    target = min(max(prefill, lowest), highest)
    kept = "within the band: hold" if target == prefill else f"{prefill} -> {target} prefill"
    return target, (f"{engines} P/D engines cannot cover the needs {prefill_need:.2f} + {decode_need:.2f}: split by "
                    f"need -> {ideal:.2f} prefill (band {lowest}..{highest}): {kept}")


def _into_range(prefill: int, low: int, high: int) -> int:
    """From outside [low, high]: past the near edge by a quarter of the range."""
    margin = _round((high - low) / 4)
    return low + margin if prefill < low else high - margin


def _round(value: float) -> int:
    return int(math.floor(value + 0.5))


def _standing_since(previous: tuple[Ratio, datetime] | None, current: Ratio, recommended: Ratio,
                    now: datetime) -> datetime:
    """Since when a change in this direction (more prefill, or more decode) has been recommended: the
    previous recommendation's time when it went the same way, else now. The exact count may wander while
    the need grows; the direction is what must stand."""
    if previous is None:
        return now
    direction = _sign(recommended.prefill - current.prefill)
    return previous[1] if direction != 0 and _sign(previous[0].prefill - current.prefill) == direction else now


def _sign(value: int) -> int:
    return (value > 0) - (value < 0)


def _blocked_by(gates: Gates, settings: PlannerSettings, now: datetime, since: datetime) -> str | None:
    if gates.frozen:
        return "the fleet is frozen"
    if gates.rollout:
        return f"{gates.rollout} is running"
    if gates.rebalancing:
        return f"{gates.rebalancing} is under way"
    if not gates.planner_enabled:
        return "the planner flag is off"
    if gates.last_change_at is not None:
        ago = (now - gates.last_change_at).total_seconds()
        if ago < settings.cooldown_s:
            return f"the last change was {ago:.0f} s ago (cooldown {settings.cooldown_s:g} s)"
    standing = (now - since).total_seconds()
    if standing < settings.dwell_s:
        return f"recommended for {standing:.0f} s of the {settings.dwell_s:g} s it must stand"
    return None
