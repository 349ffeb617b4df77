"""The rebalance state machine: `step(spec, state, observations, now) -> Transition`, pure (no I/O; `now` is
a parameter). The reconciler stores `transition.state` under the row's version, then applies the actions.

Level-based, as the rollout machine is: every decision comes from the stored state and the fleet as it is
now, and the world actions (DrainEngine, ScaleRole) are idempotent and re-emitted until the fleet shows them,
so a controller that restarts mid-flip continues that flip: it never picks a second engine while one is in
flight, and an engine already flipped is never picked again (its name is in `state.flips`).

Per tick:
1. A freeze or a running rollout of the model holds the rebalance (`paused_by`); nothing moves. It resumes
   by itself when the hold lifts.
2. `baseline`: the model's counters are read at the start and again `baseline_s` later; the p90 TTFT and
   ITL between them are what a flip is compared with. Then `flipping`.
3. A flip in progress:
   - `draining`: DrainEngine until the engine's assignment is gone (the agent stopped it after its
     in-flight requests, and a prefill engine's held K/V for pending handoffs, were done); then the new
     role's deployment is asked for one more engine (ScaleRole): `starting`;
   - `starting`: done when the new role has that many ready, routable engines and every gateway routes
     on the table that has them. The flip's latency window (from its start) is judged: p90 TTFT or ITL
     over its SLO and more than `tolerance` over the baseline stops the rebalance there (`stopped`), at a
     whole ratio, with the reason.
4. No flip in progress: the target reached -> `completed`; an operator's stop -> `stopped`; else the next
   flip (flips.next_flip: the cheapest engine of a role above its target) starts.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from fleetctl.controller.rebalance.state import (
    BASELINE, COMPLETED, DONE, DRAINING, FLIPPING, FREEZE, ROLLOUT, STARTING, STOPPED, TERMINAL, DrainEngine,
    FlipJudgement, FlipState, Observations, RebalanceSpec, RebalanceState, Record, ScaleRole, Transition,
)
from fleetctl.controller.rollout.state import ServedByGateway
from fleetctl.controller.rollout.window import quantile, window_delta
from fleetctl.pd.flips import count, next_flip

WAIT_S = 1.0  # requeue while waiting for a drain, an engine or the gateways


def step(spec: RebalanceSpec, state: RebalanceState, obs: Observations, now: datetime) -> Transition:
    if state.phase in TERMINAL:
        return Transition(state)
    held = _hold(state, obs, now)
    if held is not None:
        return held
    actions: list = []
    if state.paused_by is not None:
        actions.append(Record("resumed", f"{state.paused_by} lifted: the rebalance continues"))
        state = state.but(paused_by=None)
    if state.phase == BASELINE:
        transition = _baseline(spec, state, obs, now)
    elif state.current_flip is not None:
        transition = _continue_flip(spec, state, state.current_flip, obs, now)
    else:
        transition = _next(spec, state, obs, now)
    return Transition(transition.state.but(updated_at=now), (*actions, *transition.actions),
                      transition.requeue_after_s)


def _hold(state: RebalanceState, obs: Observations, now: datetime) -> Transition | None:
    by, why = (FREEZE, "the fleet is frozen") if obs.frozen else (ROLLOUT, f"{obs.rollout} is running") \
        if obs.rollout else (None, "")
    if by is None:
        return None
    if state.paused_by == by:
        return Transition(state, (), WAIT_S)
    return Transition(state.but(paused_by=by, message=f"held: {why}", updated_at=now),
                      (Record("paused", f"held: {why}"),), WAIT_S)


def _baseline(spec: RebalanceSpec, state: RebalanceState, obs: Observations, now: datetime) -> Transition:
    started: tuple[Record, ...] = ()
    if state.baseline_started_at is None:
        state = state.but(baseline_start=_revision(obs.served, spec.class_ref), baseline_started_at=now,
                          message=f"measuring the baseline for {spec.baseline_s:g} s")
        started = (Record("started", f"{obs.desired.text()} -> {spec.target.text()}: measuring the baseline for "
                                     f"{spec.baseline_s:g} s"),)
    due = (state.baseline_started_at or now) + timedelta(seconds=spec.baseline_s)
    if now < due:
        return Transition(state, started, (due - now).total_seconds())
    ttft, itl, requests = _p90s(state.baseline_start or {}, obs.served, spec.class_ref)
    message = (f"baseline over {requests} requests: TTFT p90 {_s(ttft)}, ITL p90 {_s(itl)} "
               f"(SLO {spec.ttft_slo_s:g} s, {spec.itl_slo_s:g} s)")
    state = state.but(phase=FLIPPING, baseline_ttft_p90_s=ttft, baseline_itl_p90_s=itl, message=message)
    following = _next(spec, state, obs, now)
    return Transition(following.state, (*started, Record("baseline", message), *following.actions),
                      following.requeue_after_s)


def _next(spec: RebalanceSpec, state: RebalanceState, obs: Observations, now: datetime) -> Transition:
    if obs.desired == spec.target:
        message = f"reached {spec.target.text()} in {len(state.flips)} flip(s)"
        return Transition(state.but(phase=COMPLETED, message=message), (Record("completed", message),))
    if state.stop_requested:
        message = f"stopped by {state.stop_requested} at {obs.desired.text()} (target {spec.target.text()})"
        return Transition(state.but(phase=STOPPED, message=message), (Record("stopped", message),))
    flip = next_flip(obs.engines, obs.desired, spec.target, exclude=[f.engine for f in state.flips])
    engine = next((e for e in obs.engines if flip is not None and e.name == flip.engine), None)
    if flip is None or engine is None or engine.deployment not in obs.replicas:
        message = f"no engine left to flip at {obs.desired.text()} (target {spec.target.text()})"
        return Transition(state.but(phase=STOPPED, message=message), (Record("stopped", message),))
    replicas = obs.replicas[engine.deployment] - 1
    record = FlipState(flip.engine, engine.deployment, flip.from_role, flip.to_role, DRAINING, replicas, now,
                       _revision(obs.served, spec.class_ref))
    message = (f"flip {len(state.flips) + 1}: {flip.engine} {flip.from_role} -> {flip.to_role} "
               f"(cost {flip.cost:.1f}): draining")
    return Transition(state.but(flips=(*state.flips, record), message=message),
                      (DrainEngine(flip.engine, engine.deployment, replicas), Record("flip_started", message)),
                      WAIT_S)


def _continue_flip(spec: RebalanceSpec, state: RebalanceState, flip: FlipState, obs: Observations,
                   now: datetime) -> Transition:
    if flip.phase == DRAINING:
        if flip.engine in obs.running:
            again = flip.engine not in obs.drained or obs.replicas.get(flip.deployment) != flip.from_replicas
            return Transition(state, (DrainEngine(flip.engine, flip.deployment, flip.from_replicas),) if again else (),
                              WAIT_S)
        to_replicas = count(obs.desired, flip.to_role) + 1
        started = _replace_flip(state, flip, phase=STARTING, to_replicas=to_replicas, drained_at=now)
        message = f"{flip.engine} drained; starting an engine in {flip.to_role}"
        return Transition(started.but(message=message),
                          (ScaleRole(flip.to_role, to_replicas, flip.deployment), Record("flip_drained", message)),
                          WAIT_S)
    assert flip.phase == STARTING and flip.to_replicas is not None
    if count(obs.desired, flip.to_role) != flip.to_replicas:
        return Transition(state, (ScaleRole(flip.to_role, flip.to_replicas, flip.deployment),), WAIT_S)
    if count(obs.ready, flip.to_role) < flip.to_replicas or not obs.acknowledged:
        return Transition(state, (), WAIT_S)
    judged = judge(spec, state, flip, obs.served)
    done = _replace_flip(state, flip, phase=DONE, done_at=now, ttft_p90_s=judged.ttft_p90_s,
                         itl_p90_s=judged.itl_p90_s)
    seconds = (now - flip.started_at).total_seconds()
    message = f"{flip.engine} now serves as {flip.to_role} after {seconds:.0f} s; {judged.message}"
    if judged.worse:
        stopped = f"stopped at {obs.desired.text()}: {judged.message}"
        return Transition(done.but(phase=STOPPED, message=stopped),
                          (Record("flip_done", message), Record("stopped", stopped)))
    following = _next(spec, done.but(message=message), obs, now)
    return Transition(following.state, (Record("flip_done", message), *following.actions), following.requeue_after_s)


def judge(spec: RebalanceSpec, state: RebalanceState, flip: FlipState, served: ServedByGateway) -> FlipJudgement:
    """Whether the flip's window made TTFT or ITL worse: over the SLO and over the baseline by more than the
    tolerance (a model already over its SLO stops only if it gets worse still)."""
    ttft, itl, requests = _p90s(flip.window_start, served, spec.class_ref)
    if requests < spec.min_requests:
        return FlipJudgement(False, ttft, itl, f"{requests} requests in the flip's window: not judged "
                                               f"(fewer than {spec.min_requests})")
    worse = [
        f"{name} p90 {_s(value)} > SLO {slo:g} s" + (f" and baseline {_s(base)}" if base is not None else "")
        for name, value, slo, base in (("TTFT", ttft, spec.ttft_slo_s, state.baseline_ttft_p90_s),
                                       ("ITL", itl, spec.itl_slo_s, state.baseline_itl_p90_s))
        if value is not None and value > slo and (base is None or value > base * (1 + spec.tolerance))
    ]
    if worse:
        return FlipJudgement(True, ttft, itl, "; ".join(worse))
    return FlipJudgement(False, ttft, itl, f"TTFT p90 {_s(ttft)}, ITL p90 {_s(itl)} over {requests} requests: "
                                           "within the SLO or the baseline")


def _replace_flip(state: RebalanceState, flip: FlipState, **changes) -> RebalanceState:
    return state.but(flips=(*state.flips[:-1], replace(flip, **changes)))


def _revision(served: ServedByGateway, class_ref: str) -> ServedByGateway:
    return {gateway: {ref: c for ref, c in refs.items() if ref == class_ref} for gateway, refs in served.items()}


def _p90s(start: ServedByGateway, end: ServedByGateway, class_ref: str) -> tuple[float | None, float | None, int]:
    delta = window_delta(start, _revision(end, class_ref)).get(class_ref)
    if delta is None:
        return None, None, 0
    return quantile(delta.ttft, 0.9), quantile(delta.itl, 0.9), delta.requests


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f} s"
