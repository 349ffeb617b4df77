"""Workloads from the real Azure trace, fleet sizing, and seeded runs over them."""

from __future__ import annotations

import pytest

from fleetctl.gateway.admission import ModelSLO
from fleetctl.sim import (
    REFERENCE_SMOLLM2_CPU,
    FleetShape,
    LengthScaling,
    Outcome,
    RequestSpec,
    TraceRow,
    load_azure_trace,
    predicted_policy,
    sampled_workload,
    simulate,
    size_for_overload,
    trace_slice,
)
from fleetctl.sim.results import SimResult
from fleetctl.sim.workload import TRACES_DIR


@pytest.fixture(scope="module")
def rows() -> list[TraceRow]:
    if not (TRACES_DIR / "azure_llm_2023_conv.csv").exists():
        pytest.skip(f"no traces at {TRACES_DIR}")
    return load_azure_trace()


def test_the_trace_starts_at_zero_in_time_order(rows):
    assert rows[0].t_s == 0.0 and len(rows) == 19366
    assert all(a.t_s <= b.t_s for a, b in zip(rows, rows[1:]))


def test_a_slice_is_rebased_compressed_and_scaled():
    rows = [TraceRow(9.0, 80, 8), TraceRow(10.0, 800, 40), TraceRow(12.0, 3, 1), TraceRow(14.0, 16, 16)]
    scaling = LengthScaling(prompt_scale=8, output_scale=4, max_tokens_factor=1.5)
    assert trace_slice(rows, start_s=10.0, length_s=4.0, rate=2.0, scaling=scaling) == [
        RequestSpec(0, 0.0, 100, 10, 15),
        RequestSpec(1, 1.0, 1, 1, 2),  # lengths are at least one token; max_tokens rounds up
    ]


def test_fleet_sizing_meets_the_asked_overload_with_whole_engines(rows):
    workload = trace_slice(rows, 0.0, 600.0, 2.0, LengthScaling())
    sizing = size_for_overload(workload, 300.0, REFERENCE_SMOLLM2_CPU, 64, 1.25, 1.25)
    assert (sizing.n_prefill, sizing.n_decode) == (7, 6)  # as benchmarks/admission.py's first scenario
    assert sizing.prefill_overload == pytest.approx(sizing.prefill_demand_tokens_per_s / (7 * 162.4))
    assert abs(sizing.prefill_overload - 1.25) < 0.1 and abs(sizing.decode_overload - 1.25) < 0.1


def seeded_run(rows: list[TraceRow], seed: int) -> SimResult:
    workload = sampled_workload(rows, rate_rps=3.0, duration_s=40.0, scaling=LengthScaling(), seed=seed)
    sizing = size_for_overload(workload, 40.0, REFERENCE_SMOLLM2_CPU, 16, 1.3, 1.3)
    shape = FleetShape(sizing.n_prefill, sizing.n_decode, REFERENCE_SMOLLM2_CPU, max_num_seqs=16, kv_capacity_tokens=4096)
    return simulate(workload, shape, predicted_policy(ModelSLO(5.0)), duration_s=40.0)


def test_the_same_seed_gives_the_same_workload_and_result(rows):
    assert sampled_workload(rows, 3.0, 40.0, LengthScaling(), 7) == sampled_workload(rows, 3.0, 40.0, LengthScaling(), 7)
    first, again = seeded_run(rows, 7), seeded_run(rows, 7)
    assert first == again
    assert first.counts()[Outcome.COMPLETED] > 0 and first.counts()[Outcome.REJECTED] > 0  # an overloaded fleet


def test_different_seeds_give_different_results(rows):
    assert seeded_run(rows, 7) != seeded_run(rows, 8)


def test_sampled_arrivals_stay_in_the_window_at_about_the_rate(rows):
    workload = sampled_workload(rows, rate_rps=5.0, duration_s=200.0, scaling=LengthScaling(), seed=1)
    assert all(0 < r.arrival_s < 200.0 for r in workload)
    assert [r.request_id for r in workload] == list(range(len(workload)))
    assert 850 < len(workload) < 1150  # Poisson: 1000 expected, sd ~32
