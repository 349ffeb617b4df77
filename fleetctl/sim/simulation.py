"""One simulation run: a workload through a fleet under an admission policy, to a `SimResult`.

Deterministic: the same workload, shape and policy give an equal `SimResult` (events at one instant are
handled in the order they were scheduled: arrivals in workload order, then samples, then engine events).
Every request ends in exactly one outcome: rejected by admission, failed (refused by an engine, or not
finished when `horizon_s` is reached), or completed. Without a horizon the run goes on until every
admitted request has finished.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fleetctl.gateway.admission import AdmissionRequest
from fleetctl.sim.events import EventKind
from fleetctl.sim.fleet import Fleet, FleetShape
from fleetctl.sim.policies import Placement, Policy
from fleetctl.sim.requests import RequestSpec, SimRequest
from fleetctl.sim.results import Outcome, QueueSample, RequestResult, SimResult

Place = Callable[[Fleet, AdmissionRequest], Placement]  # where an arriving request goes, on this fleet


def simulate(workload: Sequence[RequestSpec], shape: FleetShape, policy: Policy, duration_s: float,
             sample_every_s: float = 1.0, horizon_s: float | None = None,
             control: Callable[[Fleet], None] | None = None) -> SimResult:
    """Run `workload` (arrival times within the run) and sample the queues every `sample_every_s` from 0
    to `duration_s`. `horizon_s`: stop there, failing what is unfinished; None: run until all is done.
    `control`: called at every sample with the fleet (a P:D controller flips engines from there)."""
    return run_fleet(Fleet(shape), workload, lambda fleet, admission: policy(admission, fleet.snapshot()),
                     duration_s, sample_every_s, horizon_s, control)


def run_fleet(fleet: Fleet, workload: Sequence[RequestSpec], place: Place, duration_s: float,
              sample_every_s: float = 1.0, horizon_s: float | None = None,
              control: Callable[[Fleet], None] | None = None) -> SimResult:
    """`simulate` on a fleet model of the caller's choice (the event-level `Fleet`, or the fluid one in
    fleetctl/sim/fluid.py), placing each arrival with `place`."""
    requests = [SimRequest(spec) for spec in workload]
    for request in requests:
        fleet.events.push(request.spec.arrival_s, EventKind.ARRIVAL, request)
    for k in range(int(duration_s / sample_every_s) + 1):
        fleet.events.push(k * sample_every_s, EventKind.SAMPLE)
    samples = _run(fleet, place, horizon_s, control)
    return SimResult(tuple(_result(r, horizon_s) for r in requests), tuple(samples), fleet.preemptions())


def _run(fleet: Fleet, place: Place, horizon_s: float | None,
         control: Callable[[Fleet], None] | None = None) -> list[QueueSample]:
    samples: list[QueueSample] = []
    events = fleet.events
    while events and (horizon_s is None or events.peek_time() <= horizon_s):
        event = events.pop()
        if event.kind is EventKind.ARRIVAL:
            request: SimRequest = event.payload
            admission = AdmissionRequest(request.spec.prompt_tokens, request.spec.max_tokens)
            fleet.arrive(request, admission, place(fleet, admission))
        elif event.kind is EventKind.PREFILL_DONE:
            fleet.prefill_done(event.payload)
        elif event.kind is EventKind.STEP_DONE:
            fleet.step_done(event.payload)
        elif event.kind is EventKind.ENGINE_JOIN:
            fleet.join(event.payload)
        else:
            samples.append(fleet.sample())
            if control is not None:
                control(fleet)
    return samples


def _result(request: SimRequest, horizon_s: float | None) -> RequestResult:
    outcome, reason = _how_it_ended(request, horizon_s)
    decision = request.decision
    return RequestResult(
        request_id=request.spec.request_id,
        arrival_s=request.spec.arrival_s,
        outcome=outcome,
        reason=reason,
        retry_after_s=decision.retry_after_s if decision is not None and outcome is Outcome.REJECTED else None,
        prefill_engine=request.prefill_engine,
        decode_engine=request.decode_engine,
        first_token_s=request.first_token_s,
        finished_s=request.finished_s,
        preemptions=request.preemptions,
    )


def _how_it_ended(request: SimRequest, horizon_s: float | None) -> tuple[Outcome, str]:
    decision = request.decision
    if decision is None:  # the horizon came before it arrived
        return Outcome.FAILED, f"arrives after the horizon ({horizon_s}s)"
    if not decision.admit:
        return Outcome.REJECTED, decision.reason or "rejected by admission"
    if request.failure_reason is not None:
        return Outcome.FAILED, request.failure_reason
    if request.finished_s is None:
        return Outcome.FAILED, (f"not finished at the horizon ({horizon_s}s): "
                                f"{request.generated} of {request.spec.output_tokens} tokens generated")
    return Outcome.COMPLETED, decision.reason
