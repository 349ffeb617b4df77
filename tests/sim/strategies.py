"""Hypothesis strategies for the simulator's property tests: small workloads and fleets of engines whose
speed is PROPERTY_CONSTANTS."""

from __future__ import annotations

from hypothesis import strategies as st

from fleetctl.sim import EngineConstants, FleetShape, RequestSpec

PROPERTY_CONSTANTS = EngineConstants(prefill_tokens_per_s=200.0, decode_step_base_s=0.05, decode_step_per_seq_s=0.01)


@st.composite
def workloads(draw: st.DrawFn) -> list[RequestSpec]:
    rows = draw(st.lists(st.tuples(st.floats(0, 20), st.integers(1, 400), st.integers(1, 40), st.integers(0, 20)),
                         max_size=30))
    arrivals = sorted(row[0] for row in rows)  # a workload is in arrival order
    return [RequestSpec(i, t, prompt, output, output + extra) for i, (t, (_, prompt, output, extra)) in
            enumerate(zip(arrivals, rows))]


shapes = st.builds(FleetShape, n_prefill=st.integers(1, 3), n_decode=st.integers(1, 3),
                   constants=st.just(PROPERTY_CONSTANTS), max_num_seqs=st.integers(1, 6),
                   kv_capacity_tokens=st.integers(16, 2000), max_model_len=st.none() | st.integers(50, 500))
