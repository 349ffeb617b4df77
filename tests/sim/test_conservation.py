"""Every offered request ends exactly once, with a reason when it did not complete; runs are deterministic.

Property tests over small random workloads and fleets, under each admission policy.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.gateway.admission import ModelSLO, ObservedLoadThresholds
from fleetctl.sim import (
    FleetShape,
    Outcome,
    Policy,
    RequestSpec,
    SimResult,
    admit_all_policy,
    observed_policy,
    predicted_policy,
    simulate,
)

from .strategies import PROPERTY_CONSTANTS as CONSTANTS
from .strategies import shapes, workloads

EPS = 1e-9

policies = st.one_of(
    st.builds(lambda s: predicted_policy(ModelSLO(s)), st.floats(0.2, 10)),
    st.builds(lambda w: observed_policy(ObservedLoadThresholds(max_waiting=w)), st.integers(1, 8)),
    st.just(admit_all_policy()),
)
horizons = st.none() | st.floats(0, 30)


def run(workload: list[RequestSpec], shape: FleetShape, policy: Policy, horizon_s: float | None) -> SimResult:
    return simulate(workload, shape, policy, duration_s=20.0, horizon_s=horizon_s)


@settings(max_examples=150, deadline=None)
@given(workloads(), shapes, policies, horizons)
def test_every_request_ends_once_and_the_ones_that_did_not_complete_say_why(workload, shape, policy, horizon_s):
    result = run(workload, shape, policy, horizon_s)
    assert [r.request_id for r in result.requests] == [s.request_id for s in workload]
    counts = result.counts()
    assert counts[Outcome.COMPLETED] + counts[Outcome.REJECTED] + counts[Outcome.FAILED] == len(workload)
    for r in result.requests:
        if r.outcome is not Outcome.COMPLETED:
            assert r.reason.strip(), r
        if r.outcome is Outcome.REJECTED:
            assert r.retry_after_s is not None and r.retry_after_s >= 1 and r.decode_engine is None
    assert result.preemptions == sum(r.preemptions for r in result.requests)


@settings(max_examples=150, deadline=None)
@given(workloads(), shapes, policies)
def test_without_a_horizon_only_the_context_window_fails_a_request(workload, shape, policy):
    result = run(workload, shape, policy, None)
    for spec, r in zip(workload, result.requests):
        too_long = shape.max_model_len is not None and spec.prompt_tokens + spec.max_tokens > shape.max_model_len
        assert (r.outcome is Outcome.FAILED) == (r.admitted and too_long), r


@settings(max_examples=150, deadline=None)
@given(workloads(), shapes, policies)
def test_a_completed_request_took_at_least_its_prefill_and_one_step_per_token(workload, shape, policy):
    result = run(workload, shape, policy, None)
    fastest_step = CONSTANTS.step_s(1)
    for spec, r in zip(workload, result.requests):
        if r.outcome is not Outcome.COMPLETED:
            continue
        assert r.first_token_s is not None and r.finished_s is not None
        assert r.first_token_s >= spec.arrival_s + spec.prompt_tokens / CONSTANTS.prefill_tokens_per_s + fastest_step - EPS
        assert r.finished_s >= r.first_token_s + (spec.output_tokens - 1) * fastest_step - EPS


@settings(max_examples=60, deadline=None)
@given(workloads(), shapes, policies, horizons)
def test_the_same_inputs_give_the_same_result(workload, shape, policy, horizon_s):
    assert run(workload, shape, policy, horizon_s) == run(workload, shape, policy, horizon_s)


@settings(max_examples=100, deadline=None)
@given(workloads(), shapes)
def test_admitting_everything_completes_everything_within_the_context_window(workload, shape):
    result = run(workload, shape, admit_all_policy(), None)
    assert result.with_outcome(Outcome.REJECTED) == []
    window = shape.max_model_len
    fits = [s for s in workload if window is None or s.prompt_tokens + s.max_tokens <= window]
    assert len(result.with_outcome(Outcome.COMPLETED)) == len(fits)
