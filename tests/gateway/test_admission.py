"""Admission on predicted load vs the observed-load baseline."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.gateway.admission import (
    AdmissionRequest,
    EngineLoad,
    ModelLoadSnapshot,
    ModelSLO,
    ObservedLoadThresholds,
    RunningDecode,
    admit_on_observed_load,
    admit_on_predicted_load,
    decode_load_at,
    kv_free_at,
)

SLO = ModelSLO(ttft_slo_s=2.0)
REQUEST = AdmissionRequest(num_prompt_tokens=1000, max_tokens=200)


def mixed(engine_id: str = "e0", **fields) -> EngineLoad:
    base = dict(prefill_tokens_per_s=1000.0, max_num_seqs=8, decode_step_s=0.02, kv_headroom_tokens=100_000)
    return EngineLoad(engine_id=engine_id, **{**base, **fields})


def decodes(count: int, remaining: int, kv_tokens: int = 500) -> tuple[RunningDecode, ...]:
    return tuple(RunningDecode(remaining_tokens=remaining, kv_tokens=kv_tokens) for _ in range(count))


def test_rejects_when_predicted_ttft_breaks_the_slo_with_retry_after_until_the_queue_drains():
    snapshot = ModelLoadSnapshot([mixed(queued_prefill_tokens=4500)])  # (4500 + 1000) / 1000 = 5.5 s
    decision = admit_on_predicted_load(REQUEST, snapshot, SLO)
    assert not decision.admit
    assert decision.retry_after_s == 4  # ceil(5.5 - 2.0)
    assert "predicted TTFT 5.50s > SLO 2.00s on e0" in decision.reason


def test_admits_when_a_full_decode_pool_will_have_drained_by_the_time_the_request_gets_there():
    # every slot is taken NOW, but each decode has 10 tokens left: done in 0.2 s, before our 1.2 s prefill
    snapshot = ModelLoadSnapshot([mixed(queued_prefill_tokens=200, running=decodes(8, remaining=10))])
    decision = admit_on_predicted_load(REQUEST, snapshot, SLO)
    assert decision.admit and decision.prediction.decode_load == 1
    assert not admit_on_observed_load(snapshot, ObservedLoadThresholds()).admit  # the baseline refuses


def test_rejects_when_decode_slots_stay_full_and_says_when_they_free():
    # 8 long decodes (10 s left) and 2 admitted ahead: at +1 s the pool would hold 11 of 8
    snapshot = ModelLoadSnapshot([mixed(running=decodes(8, remaining=500), admitted_ahead=2)])
    decision = admit_on_predicted_load(REQUEST, snapshot, SLO)
    assert not decision.admit
    assert decision.prediction.decode_load == 11 and "decode slots 11/8 on e0" in decision.reason
    assert decision.retry_after_s == 9  # the 3rd of them finishes at 10 s, 9 s after we would arrive
    assert admit_on_observed_load(snapshot, ObservedLoadThresholds(max_running_fraction=2.0)).admit


def test_max_decode_slots_in_the_slo_caps_below_max_num_seqs():
    snapshot = ModelLoadSnapshot([mixed(running=decodes(4, remaining=500))])
    assert admit_on_predicted_load(REQUEST, snapshot, SLO).admit
    assert not admit_on_predicted_load(REQUEST, snapshot, replace(SLO, max_decode_slots=4)).admit


def test_rejects_when_kv_will_not_hold_the_prompt():
    engine = mixed(kv_headroom_tokens=1500, queued_prefill_tokens=500, running=decodes(2, remaining=400))
    # we arrive at +1.5 s; by then the two decodes grew 75 tokens each and the queued prompts took 500:
    # 1500 - 150 - 500 = 850 free < 1000 needed
    decision = admit_on_predicted_load(REQUEST, ModelLoadSnapshot([engine]), SLO)
    assert not decision.admit and "KV 850 tokens free < 1000 needed on e0" in decision.reason
    assert decision.retry_after_s == 7  # the first decode frees 575 at 8 s, 6.5 s after we would arrive


def test_pd_pairs_the_fastest_prefill_with_a_decode_engine_that_has_room():
    snapshot = ModelLoadSnapshot([
        mixed("p-busy", role="prefill", queued_prefill_tokens=9000),
        mixed("p-free", role="prefill"),
        mixed("d-full", role="decode", running=decodes(8, remaining=900)),
        mixed("d-room", role="decode", running=decodes(3, remaining=900)),
    ])
    decision = admit_on_predicted_load(REQUEST, snapshot, SLO)
    assert decision.admit
    assert (decision.prediction.prefill_engine, decision.prediction.decode_engine) == ("p-free", "d-room")


def test_after_a_handoff_the_decode_engines_first_step_counts_toward_the_ttft():
    # prefill done at +1.5 s either way; the decode engine's step at its batch is 0.8 s: 2.3 s > the 2 s SLO
    pd = ModelLoadSnapshot([mixed("p", role="prefill", queued_prefill_tokens=500),
                            mixed("d", role="decode", decode_step_s=0.8, running=decodes(7, remaining=900))])
    decision = admit_on_predicted_load(REQUEST, pd, SLO)
    assert not decision.admit and "predicted TTFT 2.30s > SLO 2.00s on p" in decision.reason
    # one mixed engine with the same queue and step: its prefill makes the first token itself
    alone = ModelLoadSnapshot([mixed(queued_prefill_tokens=500, decode_step_s=0.8, running=decodes(7, remaining=900))])
    assert admit_on_predicted_load(REQUEST, alone, SLO).admit


def test_no_engine_rejects_with_the_longest_retry():
    decision = admit_on_predicted_load(REQUEST, ModelLoadSnapshot([]), SLO)
    assert not decision.admit and decision.retry_after_s == SLO.max_retry_after_s


def test_observed_baseline_rejects_on_waiting_threshold():
    snapshot = ModelLoadSnapshot([mixed(admitted_ahead=8), mixed("e1", admitted_ahead=9)])
    assert not admit_on_observed_load(snapshot, ObservedLoadThresholds(max_waiting=8)).admit
    assert admit_on_observed_load(snapshot, ObservedLoadThresholds(max_waiting=9)).admit


def test_decode_load_and_kv_at_a_future_time():
    engine = mixed(running=(RunningDecode(10, 100), RunningDecode(100, 200)), admitted_ahead=1, kv_headroom_tokens=1000)
    assert decode_load_at(engine, 0.1) == 4  # nobody finished yet: 2 running + 1 ahead + this one
    assert decode_load_at(engine, 0.5) == 3  # the first finished at 0.2 s
    assert kv_free_at(engine, 0.5) == 1000 + 100 - 25  # first freed its 100; the second grew 25 tokens


engines = st.builds(
    mixed,
    st.sampled_from(["e0", "e1", "e2"]),
    queued_prefill_tokens=st.integers(0, 20_000),
    admitted_ahead=st.integers(0, 8),
    running=st.lists(st.builds(RunningDecode, st.integers(1, 2000), st.integers(0, 4000)), max_size=10).map(tuple),
    kv_headroom_tokens=st.integers(0, 50_000),
)


@settings(max_examples=300, deadline=None)
@given(engines, st.integers(0, 8), st.integers(0, 50_000), st.integers(1, 4000))
def test_a_worse_pool_never_admits_what_a_better_one_rejects(engine, more_ahead, less_kv, prompt):
    request = AdmissionRequest(num_prompt_tokens=prompt, max_tokens=100)
    worse = replace(engine, admitted_ahead=engine.admitted_ahead + more_ahead, kv_headroom_tokens=engine.kv_headroom_tokens - less_kv)
    better_decision = admit_on_predicted_load(request, ModelLoadSnapshot([engine]), SLO)
    worse_decision = admit_on_predicted_load(request, ModelLoadSnapshot([worse]), SLO)
    assert better_decision.admit or not worse_decision.admit
    if not worse_decision.admit:
        assert 1 <= worse_decision.retry_after_s <= SLO.max_retry_after_s


@settings(max_examples=300, deadline=None)
@given(engines, st.integers(1, 20_000), st.integers(1, 4000))
def test_a_longer_queue_never_admits_what_breaks_the_ttft_slo(engine, extra_queue, prompt):
    # (a longer queue CAN admit what a shorter one rejects for KV or slots: decodes finish meanwhile)
    request = AdmissionRequest(num_prompt_tokens=prompt, max_tokens=100)
    lighter = admit_on_predicted_load(request, ModelLoadSnapshot([engine]), SLO)
    longer = replace(engine, queued_prefill_tokens=engine.queued_prefill_tokens + extra_queue)
    if not lighter.admit and "TTFT" in lighter.reason:
        assert not admit_on_predicted_load(request, ModelLoadSnapshot([longer]), SLO).admit
