"""The fluid fleet (fleetctl/sim/fluid.py): hand-worked timings, the event-level fleet's invariants, role
flips, and agreement with the event-level fleet on real trace workloads."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.pd.planner import PlannerSettings
from fleetctl.sim import (
    REFERENCE_SMOLLM2_CPU,
    EngineConstants,
    FleetShape,
    LengthScaling,
    Outcome,
    RequestSpec,
    SimResult,
    admit_all_policy,
    load_azure_trace,
    sampled_workload,
    simulate,
)
from fleetctl.sim.fleet import Fleet
from fleetctl.sim.fluid import FluidFleet, simulate_fluid
from fleetctl.sim.pd_control import PlannerControl, sim_profile
from fleetctl.sim.results import goodput
from fleetctl.sim.workload import TRACES_DIR, one_after_another

from .strategies import PROPERTY_CONSTANTS, shapes, workloads

CONSTANTS = EngineConstants(prefill_tokens_per_s=128.0, decode_step_base_s=0.125, decode_step_per_seq_s=0.0625)
EPS = 1e-9


def spec(request_id: int, arrival_s: float, prompt: int, output: int) -> RequestSpec:
    return RequestSpec(request_id, arrival_s, prompt, output, output)


def shape(n_prefill: int = 1, n_decode: int = 1, **fields) -> FleetShape:
    return FleetShape(n_prefill=n_prefill, n_decode=n_decode, constants=CONSTANTS, max_num_seqs=4,
                      kv_capacity_tokens=10_000, **fields)


def test_one_request_takes_its_prefill_then_one_step_per_token():
    # prefill 0 -> 1.0; alone in the batch a step is 0.1875 s: first token 1.1875, done after 2 steps, 1.375
    (a,) = simulate_fluid([spec(0, 0.0, 128, 2)], shape(), duration_s=2.0).requests
    assert (a.outcome, a.prefill_engine, a.decode_engine) == (Outcome.COMPLETED, "p0", "d0")
    assert (a.first_token_s, a.finished_s) == (1.1875, 1.375)


def test_sequences_in_one_batch_share_its_step_time():
    # Both prefill 0 -> 1.0 and join at 1.0: two sequences make a 0.25 s step, so two tokens take 0.5 s for
    # both; the first to join reports its first token one batch-of-one step in (it joined a batch of one).
    a, b = simulate_fluid([spec(0, 0.0, 128, 2), spec(1, 0.0, 128, 2)], shape(n_prefill=2), 2.0).requests
    assert (a.prefill_engine, b.prefill_engine) == ("p0", "p1")
    assert (a.finished_s, b.finished_s) == (1.5, 1.5)
    assert (a.first_token_s, b.first_token_s) == (1.1875, 1.25)


def test_a_sequence_joining_slows_the_batch_from_then_on():
    # A alone from 1.0 at 0.1875 s a step: 4/3 steps done when B (prefill 1.0 -> 1.25) joins at 1.25. A's
    # last 2/3 step runs at the batch of two (0.25 s): done at 1.25 + 0.25 * 2/3. B then has 1/3 of its
    # step left, alone again: 0.1875 / 3 more. A one-token request's first token is its last.
    a, b = simulate_fluid([spec(0, 0.0, 128, 2), spec(1, 1.0, 32, 1)], shape(), 2.0).requests
    assert a.finished_s == pytest.approx(1.25 + 0.25 * 2 / 3)
    assert b.first_token_s == b.finished_s == pytest.approx(1.25 + 0.25 * 2 / 3 + 0.1875 / 3)


def test_placement_goes_to_the_least_loaded_engines():
    # three prompts at once on 2P:2D: the first two split across both prefill and both decode engines, the
    # third goes to the prefill engine that drains first (the shorter prompt's) and a decode engine with one
    result = simulate_fluid([spec(0, 0.0, 256, 4), spec(1, 0.0, 64, 4), spec(2, 0.0, 64, 4)], shape(2, 2), 5.0)
    placed = [(r.prefill_engine, r.decode_engine) for r in result.requests]
    assert placed[0] == ("p0", "d0") and placed[1] == ("p1", "d1") and placed[2][0] == "p1"


@settings(max_examples=150, deadline=None)
@given(workloads(), shapes)
def test_without_a_horizon_everything_within_the_context_window_completes_no_sooner_than_its_work(workload, fleet):
    result = simulate_fluid(workload, fleet, duration_s=20.0)
    assert [r.request_id for r in result.requests] == [s.request_id for s in workload]
    fastest_step = PROPERTY_CONSTANTS.step_s(1)
    for s, r in zip(workload, result.requests):
        too_long = fleet.max_model_len is not None and s.prompt_tokens + s.max_tokens > fleet.max_model_len
        assert (r.outcome is Outcome.FAILED) == too_long, r
        if r.outcome is Outcome.COMPLETED:
            prefilled = s.arrival_s + s.prompt_tokens / PROPERTY_CONSTANTS.prefill_tokens_per_s
            assert prefilled + fastest_step - EPS <= r.first_token_s <= r.finished_s
            assert r.finished_s >= prefilled + s.output_tokens * fastest_step - EPS
    assert result.preemptions == 0


@settings(max_examples=60, deadline=None)
@given(workloads(), shapes, st.none() | st.floats(0, 30))
def test_the_same_inputs_give_the_same_result(workload, fleet, horizon_s):
    assert simulate_fluid(workload, fleet, 20.0, horizon_s=horizon_s) == simulate_fluid(workload, fleet, 20.0,
                                                                                        horizon_s=horizon_s)


def test_a_flipped_decode_engine_takes_nothing_new_leaves_when_idle_and_returns_as_prefill():
    flipped: list[tuple[float, list[str], list[str]]] = []

    def control(fleet: Fleet) -> None:
        if fleet.now == 1.0:
            fleet.start_flip("d0", "prefill", restart_s=2.0)
        flipped.append((fleet.now, [e.name for e in fleet.prefill], [e.name for e in fleet.decode]))

    work = [spec(i, i * 0.25, 32, 8) for i in range(24)]
    result = simulate_fluid(work, shape(1, 2), 8.0, control=control)
    assert all(r.outcome is Outcome.COMPLETED for r in result.requests)
    # nothing arriving after the flip's start was placed on d0
    assert all(r.decode_engine == "d1" for r in result.requests if r.arrival_s > 1.0)
    left = next(t for t, _, decode in flipped if "d0" not in decode)
    back = next(t for t, prefill, _ in flipped if "p1" in prefill)
    assert 1.0 < left and back >= left + 2.0 - 1.0  # samples are a second apart
    assert flipped[-1][1:] == (["p0", "p1"], ["d1"])


@pytest.fixture(scope="module")
def trace_workload() -> list[RequestSpec]:
    if not (TRACES_DIR / "azure_llm_2023_code.csv").exists():
        pytest.skip(f"no traces at {TRACES_DIR}")
    code = sampled_workload(load_azure_trace(TRACES_DIR / "azure_llm_2023_code.csv"), 9.0, 120.0,
                            LengthScaling(8.0, 4.0), seed=1)
    conv = sampled_workload(load_azure_trace(TRACES_DIR / "azure_llm_2023_conv.csv"), 5.0, 120.0,
                            LengthScaling(8.0, 4.0), seed=2)
    return one_after_another(code, conv, 120.0)


def within_slo(result: SimResult, work: list[RequestSpec]) -> float:
    return goodput(result, work, ttft_slo_s=10.0, itl_slo_s=0.3)  # the reference class's SLOs


@pytest.mark.parametrize("n_prefill", [6, 9, 11])
def test_the_fluid_fleet_agrees_with_the_event_level_fleet_on_a_trace(trace_workload, n_prefill):
    fleet = FleetShape(n_prefill, 16 - n_prefill, REFERENCE_SMOLLM2_CPU, max_num_seqs=16)
    event = simulate(trace_workload, fleet, admit_all_policy(), 240.0, horizon_s=360.0)
    fluid = simulate_fluid(trace_workload, fleet, 240.0, horizon_s=360.0)
    assert within_slo(fluid, trace_workload) == pytest.approx(within_slo(event, trace_workload), abs=0.02)

    def mean_ttft(result: SimResult) -> float:
        return statistics.mean(r.ttft_s for r in result.requests if r.ttft_s is not None)

    assert mean_ttft(fluid) == pytest.approx(mean_ttft(event), rel=0.1)
    completed = Outcome.COMPLETED
    assert fluid.counts()[completed] == pytest.approx(event.counts()[completed], rel=0.01)


def test_the_planner_makes_the_same_decisions_on_both_fleet_models(trace_workload):
    profile = sim_profile(REFERENCE_SMOLLM2_CPU, 16, 0.3)
    settings_ = PlannerSettings(ttft_slo_s=10.0, itl_slo_s=0.3, cooldown_s=60.0)
    fleet = FleetShape(11, 5, REFERENCE_SMOLLM2_CPU, max_num_seqs=16)
    on_event, on_fluid = PlannerControl(settings_, profile, 20.0), PlannerControl(settings_, profile, 20.0)
    simulate(trace_workload, fleet, admit_all_policy(), 240.0, horizon_s=360.0, control=on_event)
    simulate_fluid(trace_workload, fleet, 240.0, horizon_s=360.0, control=on_fluid)
    event_plans = [(t, r.recommended) for t, r in on_event.recommendations]
    fluid_plans = [(t, r.recommended) for t, r in on_fluid.recommendations]
    assert [t for t, _ in event_plans] == [t for t, _ in fluid_plans] and len(event_plans) > 20
    # the two models' queues differ by a request here and there, and on 16 engines a plan often sits on the
    # edge between two counts: a plan may differ by one engine, most are the same, and so is where it ends
    assert all(abs(e.prefill - f.prefill) <= 1 for (_, e), (_, f) in zip(event_plans, fluid_plans))
    assert sum(e == f for e, f in zip(event_plans, fluid_plans)) >= 0.7 * len(event_plans)
    assert event_plans[-1] == fluid_plans[-1]

    def first_decision(control: PlannerControl) -> tuple[float, object]:
        return next((t, r.recommended) for t, r in control.recommendations if r.action == "rebalance")

    assert first_decision(on_fluid) == first_decision(on_event)


def test_the_fluid_fleet_is_a_fleet():
    assert isinstance(FluidFleet(shape()), Fleet)
