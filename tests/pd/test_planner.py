"""The P:D planner's properties (hypothesis) and its reasoning on fixed inputs."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.pd.planner import EngineProfile, Gates, Load, PlannerSettings, Ratio, Snapshot, plan

NOW = datetime(2026, 12, 3, tzinfo=timezone.utc)
PROFILE = EngineProfile(prefill_tokens_per_s=1000.0, decode_slots=16.0)
SETTINGS = PlannerSettings(ttft_slo_s=2.0, itl_slo_s=0.05, headroom=0.2, band=0.3, cooldown_s=300.0)

rates = st.floats(min_value=0.05, max_value=200.0, allow_nan=False)
lengths = st.floats(min_value=1.0, max_value=16_000.0, allow_nan=False)
hits = st.floats(min_value=0.0, max_value=0.95, allow_nan=False)


@st.composite
def ratios(draw: st.DrawFn, low: int = 2, high: int = 64) -> Ratio:
    engines = draw(st.integers(min_value=low, max_value=high))
    prefill = draw(st.integers(min_value=1, max_value=engines - 1))
    return Ratio(prefill, engines - prefill)


def load(rps: float = 4.0, isl: float = 1000.0, osl: float = 200.0, hit: float = 0.0, **extra) -> Load:
    return Load(arrival_rps=rps, mean_input_tokens=isl, mean_output_tokens=osl, prefix_hit_rate=hit, **extra)


@settings(max_examples=300, deadline=None)
@given(ratios(), rates, lengths, lengths, hits, st.floats(min_value=1.0, max_value=20.0))
def test_more_prefill_work_never_recommends_fewer_prefill_engines(current, rps, isl, osl, hit, factor) -> None:
    less = plan(Snapshot("m", current, load(rps, isl, osl, hit), PROFILE), SETTINGS, NOW)
    more = plan(Snapshot("m", current, load(rps, isl * factor, osl, hit), PROFILE), SETTINGS, NOW)
    assert more.recommended.prefill >= less.recommended.prefill
    lower_hits = plan(Snapshot("m", current, load(rps, isl, osl, hit / factor), PROFILE), SETTINGS, NOW)
    assert lower_hits.recommended.prefill >= less.recommended.prefill  # a miss is prefill work to do


@settings(max_examples=300, deadline=None)
@given(ratios(), rates, lengths, lengths, hits, st.integers(min_value=1, max_value=3), st.integers(min_value=1, max_value=3))
def test_floors_are_always_respected(current, rps, isl, osl, hit, floor_p, floor_d) -> None:
    engines = current.prefill + current.decode
    floored = PlannerSettings(floor_prefill=floor_p, floor_decode=floor_d)
    rec = plan(Snapshot("m", current, load(rps, isl, osl, hit), PROFILE), floored, NOW)
    assert rec.recommended.prefill + rec.recommended.decode == engines  # a rebalance keeps the count
    if engines >= floor_p + floor_d:
        assert rec.recommended.prefill >= floor_p and rec.recommended.decode >= floor_d
    else:
        assert rec.recommended == current and rec.action == "hold"


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=4, max_value=32), st.floats(min_value=0.0, max_value=1.0), st.data())
def test_hysteresis_holds_the_ratio_under_noise_around_a_boundary(engines, where, data) -> None:
    """Load whose ideal split sits within the band of the current count never moves it, however it jitters."""
    current_prefill = data.draw(st.integers(min_value=1, max_value=engines - 1))
    current = Ratio(current_prefill, engines - current_prefill)
    # pick a decode load so the ideal prefill lands at current +- (0.5 + band) * where
    reach = 0.5 + SETTINGS.band
    for sign in (-1, 1):
        ideal = current_prefill + sign * reach * where * 0.999
        ideal = min(max(ideal, 1.0), engines - 1.0)
        prefill_need = 1.0
        decode_need = prefill_need * (engines - ideal) / ideal
        # invert the need formulas: prefill_need = rps * isl / tps * 1.2; decode_need = rps * osl * itl / slots * 1.2
        rps = 1.0
        isl = prefill_need / 1.2 * PROFILE.prefill_tokens_per_s / rps
        osl = decode_need / 1.2 * PROFILE.decode_slots / (rps * SETTINGS.itl_slo_s)
        rec = plan(Snapshot("m", current, load(rps, isl, osl), PROFILE), SETTINGS, NOW)
        assert rec.recommended == current, (rec.ideal_prefill, rec.reasons)


@settings(max_examples=200, deadline=None)
@given(ratios(low=4), rates, lengths, lengths, st.sampled_from(["frozen", "rollout", "rebalancing", "flag", "cooldown"]))
def test_it_never_acts_on_a_frozen_fleet_during_a_rollout_or_a_rebalance(current, rps, isl, osl, gate) -> None:
    gates = {
        "frozen": Gates(frozen=True),
        "rollout": Gates(rollout="rollout 3"),
        "rebalancing": Gates(rebalancing="rebalance 2 of m"),
        "flag": Gates(planner_enabled=False),
        "cooldown": Gates(last_change_at=NOW - timedelta(seconds=10)),
    }[gate]
    rec = plan(Snapshot("m", current, load(rps, isl, osl), PROFILE, gates), SETTINGS, NOW)
    assert rec.action == "hold"
    if rec.changes:
        assert rec.blocked_by is not None


def test_reasoning_on_fixed_inputs() -> None:
    """3 decode engines x 16 slots = 48 < the 60 concurrent sequences predicted, prefill has room: +1 decode."""
    current = Ratio(prefill=3, decode=3)
    # 6 req/s x 200 output tokens x 0.05 s = 60 concurrent; x1.2 = 72 -> 4.5 decode engines
    # 6 req/s x 250 uncached tokens = 1500 tok/s; x1.2 = 1800 -> 1.8 prefill engines
    rec = plan(Snapshot("m", current, load(6.0, 500.0, 200.0, hit=0.5), PROFILE), SETTINGS, NOW)
    assert rec.recommended == Ratio(prefill=2, decode=4)
    assert rec.action == "rebalance" and rec.blocked_by is None
    prefill, decode, split, change = rec.reasons
    assert prefill == ("prefill: 6.00 req/s x 250 uncached prompt tokens (50% prefix hits) = 1500 tok/s; "
                       "1000 tok/s/engine x 3 = 3000 >= 1800 with 20% headroom -> 1.80 engines")
    assert decode == ("decode: 6.00 req/s x 200 output tokens x 0.05 s ITL SLO = 60.0 concurrent; decode slots at "
                      "ITL SLO 16/engine x 3 = 48 < 72.0 with headroom -> 4.50 engines")
    assert split == "split 6 P/D engines by need -> 1.71 prefill; more than 0.8 from 3 -> 2 prefill"
    assert change == "-> 2P:4D"


def test_a_prefill_queue_that_outlasts_half_the_ttft_slo_adds_a_prefill_engine() -> None:
    current = Ratio(prefill=1, decode=3)
    quiet = plan(Snapshot("m", current, load(1.0, 500.0, 100.0), PROFILE), SETTINGS, NOW)
    queued = plan(Snapshot("m", current, load(1.0, 500.0, 100.0, prefill_queue=5), PROFILE), SETTINGS, NOW)
    assert quiet.prefill_need < 1.0 and queued.prefill_need == 2.0
    assert "5 queued take 2.5 s to clear > half the TTFT SLO (2 s)" in queued.reasons[0]
    assert queued.recommended.prefill >= quiet.recommended.prefill


def test_a_held_change_says_why() -> None:
    rec = plan(Snapshot("m", Ratio(3, 3), load(6.0, 500.0, 200.0, hit=0.5), PROFILE, Gates(frozen=True)), SETTINGS, NOW)
    assert (rec.action, rec.blocked_by, rec.recommended) == ("hold", "the fleet is frozen", Ratio(2, 4))
    assert rec.reasons[-1] == "-> 2P:4D, held: the fleet is frozen"
