"""`fleetctl traffic shift`: move a model's traffic to one class revision in steps, without gates.

The plan is pure (`plan_steps`): from the model's current weights, B's share of the traffic rises by `step`
percentage points per step until it is 100%; the other revisions share the rest in proportion to their
current weights. Weights are written as percentages, so a step's weights sum to 100.

The run (`run_shift`) stores each step through the ordinary traffic API (the split guard applies, exactly as
for `traffic set`), waits until every live gateway acknowledged it, then waits the interval. Where it is is
kept in a `Position`, so that a Ctrl-C can say exactly where the weights were left (`interrupted_line`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

EPSILON = 1e-9  # a share this close to 100 is 100 (float steps such as 0.1 do not add up exactly)
PLACES = 4  # weights are rounded to this many decimals
MIN_STEP = 0.1  # percentage points: at most 1000 steps

# phases of a step
STORING = "storing"  # the PUT of the step's weights is in flight: stored or not, the reply will say
ACKNOWLEDGING = "acknowledging"  # stored; waiting for the gateways
WAITING = "waiting"  # stored and acknowledged; waiting the interval before the next step
DONE = "done"


@dataclass(frozen=True)
class Step:
    number: int  # 1-based
    share: float  # B's share after it, in percent
    weights: dict[str, float]  # what is stored: revision -> weight in percent


def current_share(weights: Mapping[str, float], to: str) -> float:
    """B's share of the positive weights, in percent (0 when it has none)."""
    total = sum(w for w in weights.values() if w > 0)
    return 100.0 * max(weights.get(to, 0.0), 0.0) / total if total > 0 else 0.0


def plan_steps(weights: Mapping[str, float], to: str, step: float) -> list[Step]:
    """The steps from `weights` to all traffic on `to`; empty when it has all of it already."""
    if not (MIN_STEP <= step <= 100):
        raise ValueError(f"must be between {MIN_STEP:g} and 100 percentage points, not {step:g}")
    start = current_share(weights, to)
    shares: list[float] = []
    while start + len(shares) * step < 100 - EPSILON:
        share = start + (len(shares) + 1) * step  # from the start each time: no float drift over many steps
        shares.append(100.0 if share >= 100 - EPSILON else round(share, PLACES))
    return [Step(i + 1, share, weights_at(weights, to, share)) for i, share in enumerate(shares)]


def weights_at(weights: Mapping[str, float], to: str, share: float) -> dict[str, float]:
    """`to` at `share` percent; every other revision named in `weights` shares the rest in proportion
    (kept, at 0 if it had none, so a revision that loses its traffic is still shown)."""
    others = {ref: max(w, 0.0) for ref, w in weights.items() if ref != to}
    rest, total = 100.0 - share, sum(others.values())
    shifted = {ref: round(rest * w / total, PLACES) if total > 0 else 0.0 for ref, w in others.items()}
    return {**shifted, to: round(share, PLACES)}


def format_shares(weights: Mapping[str, float], to: str) -> str:
    """'chat@r2 30%, chat@r1 70%': each revision's share of the traffic, B first, then the others with some."""
    total = sum(w for w in weights.values() if w > 0)
    share = {ref: round(100.0 * w / total, 2) if total > 0 and w > 0 else 0.0 for ref, w in weights.items()}
    shown = [(to, share.get(to, 0.0))] + [(ref, s) for ref, s in share.items() if ref != to and s > 0]
    return ", ".join(f"{ref} {s:g}%" for ref, s in shown)


# --- running the steps ---

@dataclass
class Position:
    """Where a running shift is: the last step stored and acknowledged, and what it is doing now."""

    steps: list[Step]
    start: dict[str, float]  # the weights before the first step
    acknowledged: int = 0  # steps stored and acknowledged by every live gateway
    current: int = 0  # the step being stored or acknowledged (0: none yet)
    phase: str = STORING
    results: list[dict[str, Any]] = field(default_factory=list)  # per acknowledged step, for the summary

    def step(self, number: int) -> Step:
        return self.steps[number - 1]


@dataclass(frozen=True)
class ShiftCalls:
    """What the run does to the world, injected so a test can drive it with fakes and a fake clock."""

    store: Callable[[Step], int]  # stores the step's weights; returns the routing generation that includes them
    acknowledge: Callable[[int], dict[str, Any]]  # generation -> {gateways, stale, seconds}; raises on timeout
    sleep: Callable[[float], None]
    report: Callable[[str], None]  # one progress line (stderr)


def run_shift(position: Position, to: str, interval_s: float, calls: ShiftCalls) -> Position:
    """Store, acknowledge and wait out each step in turn; `position` says how far it got at any moment."""
    total = len(position.steps)
    for step in position.steps:
        position.current, position.phase = step.number, STORING
        generation = calls.store(step)
        position.phase = ACKNOWLEDGING
        applied = calls.acknowledge(generation)
        position.acknowledged, position.phase = step.number, WAITING
        position.results.append({"step": step.number, "share": step.share, "weights": step.weights,
                                 "generation": generation, "applied": applied})
        last = step.number == total
        calls.report(step_line(step, total, to, generation, applied, None if last else interval_s))
        if not last:
            calls.sleep(interval_s)
    position.phase = DONE
    return position


def step_line(step: Step, total: int, to: str, generation: int, applied: Mapping[str, Any],
              next_in_s: float | None) -> str:
    gateways = applied.get("gateways") or []
    acked = (f"generation {generation} applied by {len(gateways)} gateway(s) in {applied.get('seconds', 0):.1f}s"
             if gateways else f"generation {generation}, no live gateway to wait for")
    then = f"; next step in {next_in_s:g}s" if next_in_s is not None else ""
    return f"step {step.number}/{total}: {format_shares(step.weights, to)} ({acked}){then}"


# --- saying where an interrupted shift left the weights ---

def interrupted_line(model: str, to: str, position: Position, stored: Mapping[str, float] | None) -> str:
    """One line: where the weights are after a Ctrl-C. `stored` is the policy read back after the interrupt
    (None when it could not be read); it only matters when a PUT was in flight."""
    total = len(position.steps)
    k = position.current
    if k == 0:
        return f"interrupted before the first step: traffic for {model} unchanged"
    if position.phase == DONE:
        return f"interrupted after the last step: traffic for {model} is all on {to}"
    if position.phase == WAITING:
        return (f"interrupted: traffic for {model} left at step {k}/{total} "
                f"({format_shares(position.step(k).weights, to)}), acknowledged by every live gateway")
    if position.phase == ACKNOWLEDGING:
        return (f"interrupted: traffic for {model} left at step {k}/{total} "
                f"({format_shares(position.step(k).weights, to)}): stored, not yet acknowledged by every live gateway")
    return _in_flight_line(model, to, position, stored)


def _in_flight_line(model: str, to: str, position: Position, stored: Mapping[str, float] | None) -> str:
    k, total = position.current, len(position.steps)
    before = position.step(k - 1).weights if k > 1 else position.start
    if stored is None:
        where_before = f"at step {k - 1}/{total}" if k > 1 else "as before the shift"
        return (f"interrupted while storing step {k}/{total}: traffic for {model} is {where_before} or at step "
                f"{k}; the controller could not be read back (check with `fleetctl traffic get {model}`)")
    if same_weights(stored, position.step(k).weights):
        return (f"interrupted: traffic for {model} left at step {k}/{total} "
                f"({format_shares(stored, to)}): stored as the interrupt came, not waited for")
    if same_weights(stored, before):
        left = f"left at step {k - 1}/{total}" if k > 1 else "unchanged"
        return f"interrupted: traffic for {model} {left} ({format_shares(stored, to)})"
    return f"interrupted: traffic for {model} is at {format_shares(stored, to)} (changed by someone else meanwhile)"


def same_weights(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    """Equal as stored policies: the same revisions with weights equal to the stored precision (a revision
    at 0 counts as absent)."""
    def positive(w: Mapping[str, float]) -> dict[str, float]:
        return {ref: round(v, PLACES) for ref, v in w.items() if v > 0}
    return positive(a) == positive(b)


def summary(model: str, to: str, step: float, interval_s: float, position: Position, result: str) -> dict[str, Any]:
    """The `-o json|yaml` document: what was planned and what was done."""
    return {
        "model": model, "to": to, "step": step, "interval_s": interval_s, "result": result,
        "planned": len(position.steps), "acknowledged": position.acknowledged,
        "start": position.start, "steps": position.results,
    }
