"""The P:D planner's properties (hypothesis) and its reasoning on fixed inputs."""

from __future__ import annotations

from dataclasses import replace
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


def load_for(prefill_need: float, decode_need: float) -> Load:
    """A load whose needs (with the 20% headroom) are exactly these, at 1 req/s."""
    isl = prefill_need / 1.2 * PROFILE.prefill_tokens_per_s
    osl = decode_need / 1.2 * PROFILE.decode_slots / SETTINGS.itl_slo_s
    return load(1.0, isl, osl)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=4, max_value=32), st.data())
def test_hysteresis_holds_the_ratio_under_noise_while_both_roles_fit(engines, data) -> None:
    """Needs that jitter but stay within the current split's capacity never move it."""
    current_prefill = data.draw(st.integers(min_value=1, max_value=engines - 1))
    current = Ratio(current_prefill, engines - current_prefill)
    for _ in range(5):
        prefill_need = data.draw(st.floats(min_value=max(current_prefill - 0.999, 0.01), max_value=current_prefill))
        decode_need = data.draw(st.floats(min_value=0.01, max_value=engines - current_prefill))
        rec = plan(Snapshot("m", current, load_for(prefill_need, decode_need), PROFILE), SETTINGS, NOW)
        assert rec.recommended == current, rec.reasons


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=4, max_value=32), st.floats(min_value=-0.99, max_value=0.99), st.data())
def test_hysteresis_holds_the_ratio_under_noise_around_an_overload_split(engines, where, data) -> None:
    """Overloaded (the needs exceed the engines), a proportional split that jitters within the band of the
    current count never moves it."""
    current_prefill = data.draw(st.integers(min_value=1, max_value=engines - 1))
    current = Ratio(current_prefill, engines - current_prefill)
    ideal = current_prefill + where * min(SETTINGS.band, 0.45)
    ideal = min(max(ideal, 1.0), engines - 1.0)
    total = engines * data.draw(st.floats(min_value=1.1, max_value=3.0))  # more need than engines
    prefill_need = total * ideal / engines
    rec = plan(Snapshot("m", current, load_for(prefill_need, total - prefill_need), PROFILE), SETTINGS, NOW)
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


def test_a_short_role_moves_a_quarter_of_the_way_into_the_range_where_both_fit() -> None:
    rec = plan(Snapshot("m", Ratio(1, 9), load_for(2.5, 4.0), PROFILE), SETTINGS, NOW)
    assert rec.recommended == Ratio(4, 6)  # 3..6 prefill fit both: past the near edge 3 by a quarter of 3, rounded
    assert rec.reasons[2] == "10 P/D engines cover both needs with 3..6 prefill (ceil 2.50 .. 10 - ceil 4.00): 1 -> 4 prefill"


def test_reasoning_on_fixed_inputs() -> None:
    """3 decode engines x 16 slots = 48 < the 60 concurrent sequences predicted, prefill has room: +1 decode."""
    current = Ratio(prefill=3, decode=3)
    # 6 req/s x 200 output tokens x 0.05 s = 60 concurrent; x1.2 = 72 -> 4.5 decode engines
    # 6 req/s x 250 uncached tokens = 1500 tok/s; x1.2 = 1800 -> 1.8 prefill engines
    stood = Gates(previous=(Ratio(2, 4), NOW - timedelta(seconds=SETTINGS.dwell_s)))
    rec = plan(Snapshot("m", current, load(6.0, 500.0, 200.0, hit=0.5), PROFILE, stood), SETTINGS, NOW)
    assert rec.recommended == Ratio(prefill=2, decode=4)
    assert rec.action == "rebalance" and rec.blocked_by is None
    prefill, decode, split, change = rec.reasons
    assert prefill == ("prefill: 6.00 req/s x 250 uncached prompt tokens (50% prefix hits) = 1500 tok/s; "
                       "1000 tok/s/engine x 3 = 3000 >= 1800 with 20% headroom -> 1.80 engines")
    assert decode == ("decode: 6.00 req/s x 200 output tokens x 0.05 s ITL SLO = 60.0 concurrent; decode slots at "
                      "ITL SLO 16/engine x 3 = 48 < 72.0 with headroom -> 4.50 engines")
    assert split == ("6 P/D engines cannot cover the needs 1.80 + 4.50: split by need -> 1.71 prefill (band 1..2): "
                     "3 -> 2 prefill")
    assert change == "-> 2P:4D"


def test_a_prefill_queue_that_outlasts_half_the_ttft_slo_adds_a_prefill_engine() -> None:
    current = Ratio(prefill=1, decode=3)
    quiet = plan(Snapshot("m", current, load(1.0, 500.0, 100.0), PROFILE), SETTINGS, NOW)
    queued = plan(Snapshot("m", current, load(1.0, 500.0, 100.0, prefill_queue=5), PROFILE), SETTINGS, NOW)
    assert quiet.prefill_need < 1.0 and queued.prefill_need == 2.0
    assert "5 queued take 2.5 s to clear > half the TTFT SLO (2 s)" in queued.reasons[0]
    assert queued.recommended.prefill >= quiet.recommended.prefill


def test_handoffs_waiting_longer_than_the_itl_slo_add_a_decode_engine_and_a_brief_wait_does_not() -> None:
    current = Ratio(prefill=2, decode=4)  # 64 decode slots for ~2.4 concurrent: room to spare
    brief = plan(Snapshot("m", current, load(20.0, 100.0, 2.0, decode_queue=1), PROFILE), SETTINGS, NOW)
    assert brief.decode_need < 1.0  # 1 waiting at 20 req/s: ~0.05 s, within the 0.05 s ITL SLO
    assert "handoffs wait" not in brief.reasons[1]
    full = 4 * 16 + 3  # every slot of the 4 engines runs, 3 wait
    stuck = plan(Snapshot("m", current, load(20.0, 100.0, 2.0, decode_queue=3, decode_occupancy=full), PROFILE),
                 SETTINGS, NOW)
    assert stuck.decode_need == 5.0
    assert "3 handoffs wait ~0.15 s for a decode slot > the ITL SLO (0.05 s) -> 5" in stuck.reasons[1]


def test_a_handoff_waiting_beside_free_slots_adds_no_decode_engine() -> None:
    """At 0.4 req/s one handoff caught waiting for the engine's next step reads as a 2.5 s wait: with slots
    free it is not a shortage (bumping on it made the live advice flicker every few seconds)."""
    current = Ratio(prefill=2, decode=2)
    rec = plan(Snapshot("m", current, load(0.4, 200.0, 50.0, decode_queue=1, decode_occupancy=3.0), PROFILE),
               SETTINGS, NOW)
    assert rec.decode_need < 1.0 and "handoffs wait" not in rec.reasons[1]


def test_a_change_must_stand_for_the_dwell_before_it_is_acted_on() -> None:
    snapshot = Snapshot("m", Ratio(3, 3), load(6.0, 500.0, 200.0, hit=0.5), PROFILE)
    first = plan(snapshot, SETTINGS, NOW)
    assert (first.action, first.since) == ("hold", NOW)
    assert first.blocked_by == f"recommended for 0 s of the {SETTINGS.dwell_s:g} s it must stand"
    later = NOW + timedelta(seconds=SETTINGS.dwell_s + 1)
    second = plan(replace(snapshot, gates=Gates(previous=(first.recommended, first.since))), SETTINGS, later)
    assert (second.action, second.since) == ("rebalance", NOW)
    wandered = plan(replace(snapshot, gates=Gates(previous=(Ratio(1, 5), NOW))), SETTINGS, later)
    assert (wandered.action, wandered.since) == ("rebalance", NOW)  # the same direction: the clock runs on
    reversed_ = plan(replace(snapshot, gates=Gates(previous=(Ratio(4, 2), NOW))), SETTINGS, later)
    assert (reversed_.action, reversed_.since) == ("hold", later)  # the other way before: it starts again


def test_a_held_change_says_why() -> None:
    rec = plan(Snapshot("m", Ratio(3, 3), load(6.0, 500.0, 200.0, hit=0.5), PROFILE, Gates(frozen=True)), SETTINGS, NOW)
    assert (rec.action, rec.blocked_by, rec.recommended) == ("hold", "the fleet is frozen", Ratio(2, 4))
    assert rec.reasons[-1] == "-> 2P:4D, held: the fleet is frozen"


def test_a_decode_backlog_is_planned_as_work_to_drain_not_as_standing_concurrency() -> None:
    """Decode was short: every slot of 4 engines runs and 600 handoffs wait. The steady load is 50
    concurrent (10 req/s x 100 tokens x 0.05 s); the need is what runs (64) plus the slots that drain the
    600 waiting within backlog_drain_s (600 x 5 s / 60 s = 50), not 664 sequences held as if all ran at once."""
    backlog = load(10.0, 100.0, 100.0, decode_queue=600, decode_occupancy=664.0)
    rec = plan(Snapshot("m", Ratio(4, 4), backlog, PROFILE), SETTINGS, NOW)
    assert rec.decode_need == 114 / 16 * 1.2
    assert rec.reasons[1] == ("decode: 10.00 req/s x 100 output tokens x 0.05 s ITL SLO = 50.0 concurrent (observed "
                              "64.0 running) + 600 waiting x 5.0 s / 60 s to drain = 50.0; decode slots at ITL SLO "
                              "16/engine x 4 = 64 < 136.8 with headroom -> 8.55 engines")
    drained = plan(Snapshot("m", Ratio(4, 4), load(10.0, 100.0, 100.0, decode_occupancy=64.0), PROFILE), SETTINGS, NOW)
    assert drained.decode_need == 64 / 16 * 1.2  # running above Little's law counts: lengths lag a shift
    steady = plan(Snapshot("m", Ratio(4, 4), load(10.0, 100.0, 100.0, decode_occupancy=40.0), PROFILE), SETTINGS, NOW)
    assert steady.decode_need == 50 / 16 * 1.2


def test_little_s_law_uses_the_itl_the_profile_measured_at_full_batch_when_it_is_under_the_slo() -> None:
    """A batch capped by max_num_seqs runs faster than the ITL SLO allows: 16 slots at 0.02 s a token hold
    a sequence 100 x 0.02 = 2 s, not 100 x 0.05 = 5 s; sized at the SLO, decode would be planned 2.5x too big."""
    measured = EngineProfile(prefill_tokens_per_s=1000.0, decode_slots=16.0, decode_itl_s=0.02)
    rec = plan(Snapshot("m", Ratio(4, 4), load(10.0, 100.0, 100.0), measured), SETTINGS, NOW)
    assert rec.decode_need == 10 * 100 * 0.02 / 16 * 1.2
    assert rec.reasons[1].startswith("decode: 10.00 req/s x 100 output tokens x 0.02 s ITL at 16 slots = "
                                     "20.0 concurrent;")
    over = EngineProfile(prefill_tokens_per_s=1000.0, decode_slots=16.0, decode_itl_s=0.08)  # a stale, slower profile
    at_slo = plan(Snapshot("m", Ratio(4, 4), load(10.0, 100.0, 100.0), over), SETTINGS, NOW)
    assert at_slo.decode_need == 10 * 100 * 0.05 / 16 * 1.2 and "x 0.05 s ITL SLO =" in at_slo.reasons[1]
