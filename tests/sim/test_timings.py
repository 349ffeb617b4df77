"""Small scenarios whose every time is worked out by hand (dyadic numbers: exact in floating point).

Engines: prefill 128 tokens/s; a decode step takes 0.125 + 0.0625 x batch s (0.1875 s alone, 0.25 s for two).
"""

from __future__ import annotations

import pytest

from fleetctl.gateway.admission import ModelSLO
from fleetctl.sim import (
    EngineConstants,
    FleetShape,
    Outcome,
    QueueSample,
    RequestSpec,
    admit_all_policy,
    predicted_policy,
    simulate,
)

CONSTANTS = EngineConstants(prefill_tokens_per_s=128.0, decode_step_base_s=0.125, decode_step_per_seq_s=0.0625)


def spec(request_id: int, arrival_s: float, prompt: int, output: int, max_tokens: int | None = None) -> RequestSpec:
    return RequestSpec(request_id, arrival_s, prompt, output, max_tokens or output)


def shape(n_prefill: int = 1, kv: int = 10_000, **fields) -> FleetShape:
    return FleetShape(n_prefill=n_prefill, n_decode=1, constants=CONSTANTS, max_num_seqs=4, kv_capacity_tokens=kv, **fields)


def test_a_request_queues_behind_prefill_then_behind_a_running_decode_step():
    # A: prefill 0 -> 1.0, decode steps 1.0 -> 1.1875 -> 1.375 (done).
    # B: arrives 0.5, waits for A's prefill, prefills 1.0 -> 1.25, waits for A's step, decodes 1.375 -> 1.5625.
    result = simulate([spec(0, 0.0, 128, 2), spec(1, 0.5, 32, 1)], shape(), admit_all_policy(), duration_s=2.0,
                      sample_every_s=0.5)
    a, b = result.requests
    assert (a.outcome, a.first_token_s, a.finished_s, a.ttft_s) == (Outcome.COMPLETED, 1.1875, 1.375, 1.1875)
    assert (b.outcome, b.first_token_s, b.finished_s, b.ttft_s) == (Outcome.COMPLETED, 1.5625, 1.5625, 1.0625)
    assert (a.prefill_engine, a.decode_engine, a.reason) == ("p0", "d0", "admission off")
    # samples at an instant come after that instant's arrivals and before its engine events
    assert result.samples == (QueueSample(0.0, 1, 0, 0), QueueSample(0.5, 2, 0, 0), QueueSample(1.0, 2, 0, 0),
                              QueueSample(1.5, 0, 0, 1), QueueSample(2.0, 0, 0, 0))
    assert result.preemptions == 0


def test_a_second_sequence_joins_at_the_next_step_and_slows_it_to_the_batch_of_two():
    # Both prefill 0 -> 1.0 on their own engine; A steps alone 1.0 -> 1.1875, then A and B together
    # 1.1875 -> 1.4375 (0.25 s), then B alone 1.4375 -> 1.625.
    result = simulate([spec(0, 0.0, 128, 2), spec(1, 0.0, 128, 2)], shape(n_prefill=2), admit_all_policy(), 1.0)
    a, b = result.requests
    assert (a.prefill_engine, b.prefill_engine) == ("p0", "p1")
    assert (a.first_token_s, a.finished_s) == (1.1875, 1.4375)
    assert (b.first_token_s, b.finished_s) == (1.4375, 1.625)


def test_kv_exhaustion_preempts_the_newest_sequence_and_charges_its_recompute():
    # KV pool of 10 tokens; prompts of 4. Prefill 0 -> 0.03125 on two engines. A steps 0.03125 -> 0.21875.
    # Then B joins (KV 5 + 5 = 10) but two new tokens do not fit: B is preempted, A runs alone to 4 tokens
    # (0.40625, 0.59375, 0.78125). B runs again with its 4 tokens recomputed at the prefill rate:
    # 0.78125 + 0.1875 + 4/128 = 1.0, then 1.1875, 1.375, 1.5625.
    result = simulate([spec(0, 0.0, 4, 4), spec(1, 0.0, 4, 4)], shape(n_prefill=2, kv=10), admit_all_policy(), 1.0)
    a, b = result.requests
    assert (a.first_token_s, a.finished_s, a.preemptions) == (0.21875, 0.78125, 0)
    assert (b.first_token_s, b.finished_s, b.preemptions) == (1.0, 1.5625, 1)
    assert result.preemptions == 1


def test_the_predictor_rejects_with_its_reason_and_retry_after():
    # B at 0.5 finds 64 tokens of A left: (64 + 128) / 128 = 1.5 s of prefill + a 0.1875 s first step > 1.5 s.
    result = simulate([spec(0, 0.0, 128, 2), spec(1, 0.5, 128, 2)], shape(), predicted_policy(ModelSLO(1.5)), 1.0)
    a, b = result.requests
    assert a.outcome is Outcome.COMPLETED and a.reason == "predicted TTFT 1.19s, decode 1/4"
    assert b.outcome is Outcome.REJECTED and b.reason == "predicted TTFT 1.69s > SLO 1.50s on p0"
    assert b.retry_after_s == 1 and b.prefill_engine is None and b.first_token_s is None


def test_a_request_over_the_context_window_fails_without_taking_capacity():
    # The first (100 + 40 > 130) is refused by the engine; the second (128 + 2) then runs exactly as A did
    # in the first scenario, as if the refused one had never come.
    workload = [spec(0, 0.0, 100, 1, max_tokens=40), spec(1, 0.0, 128, 2)]
    result = simulate(workload, shape(max_model_len=130), admit_all_policy(), 1.0)
    refused, served = result.requests
    assert refused.outcome is Outcome.FAILED
    assert refused.reason == "p0 refused it: prompt 100 + max_tokens 40 > max_model_len 130"
    assert (served.outcome, served.first_token_s, served.finished_s) == (Outcome.COMPLETED, 1.1875, 1.375)


def test_the_horizon_fails_what_is_unfinished_or_not_yet_arrived():
    workload = [spec(0, 0.0, 128, 2), spec(1, 0.5, 32, 1), spec(2, 5.0, 1, 1)]
    result = simulate(workload, shape(), admit_all_policy(), 1.0, horizon_s=1.2)
    a, b, late = result.requests
    assert a.outcome is Outcome.FAILED and a.reason == "not finished at the horizon (1.2s): 1 of 2 tokens generated"
    assert a.first_token_s == 1.1875
    assert b.outcome is Outcome.FAILED and b.reason == "not finished at the horizon (1.2s): 0 of 1 tokens generated"
    assert late.outcome is Outcome.FAILED and late.reason == "arrives after the horizon (1.2s)"


def test_a_fleet_without_engines_or_speed_is_refused():
    with pytest.raises(ValueError, match="at least one"):
        FleetShape(n_prefill=0, n_decode=1, constants=CONSTANTS)
    with pytest.raises(ValueError, match="speeds must be positive"):
        FleetShape(n_prefill=1, n_decode=1, constants=EngineConstants(0.0, 0.1, 0.0))
