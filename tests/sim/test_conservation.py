"""Every offered request ends exactly once, with a reason when it did not complete; runs are deterministic.

Property tests over small random workloads and fleets, under each admission policy.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.gateway.admission import ModelSLO, ObservedLoadThresholds
from fleetctl.sim import (
    EngineConstants,
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

CONSTANTS = EngineConstants(prefill_tokens_per_s=200.0, decode_step_base_s=0.05, decode_step_per_seq_s=0.01)
EPS = 1e-9


@st.composite
def workloads(draw: st.DrawFn) -> list[RequestSpec]:
    rows = draw(st.lists(st.tuples(st.floats(0, 20), st.integers(1, 400), st.integers(1, 40), st.integers(0, 20)),
                         max_size=30))
    arrivals = sorted(row[0] for row in rows)  # a workload is in arrival order
    return [RequestSpec(i, t, prompt, output, output + extra) for i, (t, (_, prompt, output, extra)) in
            enumerate(zip(arrivals, rows))]


shapes = st.builds(FleetShape, n_prefill=st.integers(1, 3), n_decode=st.integers(1, 3), constants=st.just(CONSTANTS),
                   max_num_seqs=st.integers(1, 6), kv_capacity_tokens=st.integers(16, 2000),
                   max_model_len=st.none() | st.integers(50, 500))
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
