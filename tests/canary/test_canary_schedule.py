"""schedule.plan and budget_state over hand-built snapshots: the streams a fleet calls for, the flag, the
concurrency limit and its order, prompt rotation, the budget's stretch factors and its floor, the production
share, and the urgent streams (warming, suspect) that are funded first and follow the bad engine."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

from fleetctl.canary.schedule import (
    ModelTargets,
    PromptSlot,
    ScheduleParams,
    ScheduleSnapshot,
    StreamHistory,
    Urgency,
    budget_state,
    cost,
    fit_factor,
    effective_interval,
    estimate_prompt_tokens,
    longest_floor_interval,
    revision_conditions,
    mean_probe_tokens,
    next_index_after,
    plan,
    seconds_to_next_due,
    stream_urgency,
    streams,
)
from fleetctl.canary.types import CusumState, GoldenPrompt, Sampling, StreamKey, StreamState

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
A, B = "chat@r1", "chat@r2"
PROMPTS = tuple(PromptSlot(GoldenPrompt(id=f"p{i}", prompt="x" * 36, sampling=Sampling(max_tokens=10)), 10)
                for i in range(3))
PARAMS = ScheduleParams(pinned_interval_s=60.0, production_interval_s=5.0, floor_interval_s=120.0, budget_share=0.02,
                        budget_window_s=300.0, concurrency=100, conditions=(1, 4), production_share=1.0,
                        urgent_share=0.0)
SPLIT = ScheduleParams(**{**PARAMS.__dict__, "production_share": 0.8})  # the default production share
DEFAULTS = ScheduleParams(**{**SPLIT.__dict__, "urgent_share": 0.5})  # and the default urgent share
PROD = StreamKey("m", "production")


def pinned(ref: str, condition: int) -> StreamKey:
    return StreamKey("m", "pinned", ref, condition)


def snap(revisions: dict[str, tuple[PromptSlot, ...]] | None = None, production: tuple[PromptSlot, ...] = PROMPTS,
         **changes: object) -> ScheduleSnapshot:
    targets = ModelTargets("m", {A: PROMPTS} if revisions is None else revisions, production)
    values: dict[str, object] = {"now": NOW, "enabled": True, "models": (targets,), "busy_capacity": 1e9}
    values.update(changes)
    return ScheduleSnapshot(**values)  # type: ignore[arg-type]


def ago(seconds: float, next_index: int = 0) -> StreamHistory:
    return StreamHistory(NOW - timedelta(seconds=seconds), next_index)


def keys(planned: list) -> list[StreamKey]:
    return [p.stream for p in planned]


def test_every_stream_is_planned_once_when_nothing_was_sent_production_first() -> None:
    planned = plan(snap({A: PROMPTS, B: PROMPTS}), PARAMS)
    assert keys(planned) == [PROD, pinned(A, 1), pinned(A, 4), pinned(B, 1), pinned(B, 4)]
    prod, a1, a4 = planned[0], planned[1], planned[2]
    assert (prod.kind, prod.pin, prod.condition, len(prod.prompts)) == ("production", None, 1, 1)
    assert (a1.kind, a1.pin, len(a1.prompts)) == ("pinned", A, 1)
    assert (a4.pin, a4.condition) == (A, 4)
    assert {p.prompt_id for p in planned} == {"p0"}


def test_a_batch_probe_is_that_many_golden_prompts_in_walk_order_wrapping_around() -> None:
    a4 = plan(snap(streams={pinned(A, 4): ago(600, next_index=2)}), PARAMS)[2]
    assert a4.stream == pinned(A, 4)
    # the batch's rows are the stream's next 4 prompts: p2, then p0, p1, p2 again (3 prompts in the set)
    assert [p.id for p in a4.prompts] == ["p2", "p0", "p1", "p2"]


def test_expected_tokens_count_every_row() -> None:
    a1, a4 = plan(snap(), PARAMS)[1:3]
    assert a1.expected_tokens == 10 + 10  # prompt + max_tokens
    assert a4.expected_tokens == 4 * (10 + 10)  # four golden rows, each its prompt and max_tokens


def test_the_flag_off_plans_nothing() -> None:
    assert plan(snap(enabled=False), PARAMS) == []
    assert seconds_to_next_due(snap(enabled=False), PARAMS) is None


def test_every_revision_with_ready_engines_is_probed_whatever_its_weight() -> None:
    # the snapshot lists live revisions (ready engines), not weights: a rollout's new revision at weight 0 is one
    found = {s.key for s in streams(snap({A: PROMPTS, B: PROMPTS}), PARAMS)}
    assert {pinned(B, 1), pinned(B, 4)} <= found


def test_a_revision_without_a_reference_is_not_probed() -> None:
    found = {s.key for s in streams(snap({A: PROMPTS, B: ()}), PARAMS)}
    assert found == {PROD, pinned(A, 1), pinned(A, 4)}


def test_a_model_without_any_reference_is_not_probed() -> None:
    assert plan(snap({A: (), B: ()}, production=()), PARAMS) == []


def test_no_live_revision_no_production_probe() -> None:
    assert plan(snap({}), PARAMS) == []


def test_concurrency_takes_production_first_then_the_most_overdue() -> None:
    history = {PROD: ago(6), pinned(A, 1): ago(61), pinned(A, 4): ago(90)}
    params = ScheduleParams(**{**PARAMS.__dict__, "concurrency": 2})
    assert keys(plan(snap(streams=history), params)) == [PROD, pinned(A, 4)]


def test_never_probed_streams_are_the_most_overdue() -> None:
    history = {PROD: ago(1), pinned(A, 1): ago(500)}
    params = ScheduleParams(**{**PARAMS.__dict__, "concurrency": 1})
    assert keys(plan(snap(streams=history), params)) == [pinned(A, 4)]


def test_streams_in_flight_are_not_planned_again_and_take_their_slots() -> None:
    params = ScheduleParams(**{**PARAMS.__dict__, "concurrency": 2})
    planned = plan(snap(in_flight=frozenset({PROD})), params)
    assert keys(planned) == [pinned(A, 1)]
    assert plan(snap(in_flight=frozenset({PROD, pinned(A, 4)})), params) == []


def test_a_stream_is_due_after_its_interval() -> None:
    history = {PROD: ago(4.9), pinned(A, 1): ago(59), pinned(A, 4): ago(60)}
    assert keys(plan(snap(streams=history), PARAMS)) == [pinned(A, 4)]
    assert seconds_to_next_due(snap(streams={**history, pinned(A, 4): ago(1)}), PARAMS) == pytest.approx(0.1)


def test_prompts_rotate_per_stream() -> None:
    history = {PROD: ago(10, next_index=2), pinned(A, 1): ago(100, next_index=4), pinned(A, 4): ago(100, next_index=0)}
    by_key = {p.stream: p.prompt_id for p in plan(snap(streams=history), PARAMS)}
    assert by_key == {PROD: "p2", pinned(A, 1): "p1", pinned(A, 4): "p0"}  # modulo the 3 prompts
    assert next_index_after(PROMPTS, "p2") == 0 and next_index_after(PROMPTS, "p0") == 1
    assert next_index_after(PROMPTS, "gone") == 0


B4 = 4 * 20  # a b4 probe of the 10-token prompts: four rows of 10 + 10


def test_within_the_budget_nothing_is_stretched() -> None:
    state = budget_state(snap(busy_capacity=1e6), PARAMS)
    assert state.factor == 1.0 and state.allowed == pytest.approx(0.02e6)
    # demand: production 20 tokens / 5 s, b1 20 / 60 s, b4 B4 / 60 s
    assert state.demand == pytest.approx(20 / 5 + 20 / 60 + B4 / 60)


PINNED_AT_FLOOR = (20 + B4) / 240  # tokens/s: a pinned stream's floor is 2 conditions x 120 s


def test_over_the_budget_the_pinned_streams_stretch_to_fit_what_the_production_stream_leaves() -> None:
    production, pinned_demand = 20 / 5, 20 / 60 + B4 / 60
    capacity = (production + pinned_demand / 3) / 0.02  # the production stream fits; the pinned ones 3x over the rest
    state = budget_state(snap(busy_capacity=capacity), PARAMS)
    assert (state.factor, state.pinned_factor) == (1.0, pytest.approx(3.0))
    # production: every 5 s as configured; pinned: 60 s -> 180 s (inside their 240 s floor)
    history = {PROD: ago(5.01), pinned(A, 1): ago(179), pinned(A, 4): ago(180.01)}
    assert keys(plan(snap(busy_capacity=capacity, streams=history), PARAMS)) == [PROD, pinned(A, 4)]


def test_when_the_production_stream_is_over_what_the_floor_leaves_it_stretches_and_pinned_ones_go_to_the_floor() -> None:
    capacity = ((20 / 5) / 3 + PINNED_AT_FLOOR) / 0.02  # after the floor, the production stream is 3x what is left
    state = budget_state(snap(busy_capacity=capacity), PARAMS)
    assert state.factor == pytest.approx(3.0) and state.pinned_factor == math.inf
    history = {PROD: ago(14), pinned(A, 1): ago(239), pinned(A, 4): ago(240)}
    assert keys(plan(snap(busy_capacity=capacity, streams=history), PARAMS)) == [pinned(A, 4)]  # 5 s -> 15 s
    history[PROD] = ago(15.01)
    assert keys(plan(snap(busy_capacity=capacity, streams=history), PARAMS)) == [PROD, pinned(A, 4)]


def planned_rate(capacity: float, revisions: dict[str, tuple[PromptSlot, ...]], params: ScheduleParams = PARAMS,
                 urgent: dict[StreamKey, Urgency] | None = None) -> float:
    """Tokens/s the streams cost at the intervals the budget gives them."""
    snapshot = snap(revisions, busy_capacity=capacity, urgent=urgent or {})
    state = budget_state(snapshot, params)
    return sum(mean_probe_tokens(s) / effective_interval(s.interval_s, state.factor_for(s.key), s.floor_s)
               for s in streams(snapshot, params))


@pytest.mark.parametrize("params", [PARAMS, SPLIT, DEFAULTS])
@pytest.mark.parametrize("urgent", [{}, {pinned(A, 4): Urgency("suspect", "e1")},
                                    {pinned(A, 1): Urgency("warming"), pinned(A, 4): Urgency("warming")}])
@pytest.mark.parametrize("revisions", [{A: PROMPTS}, {A: PROMPTS, B: PROMPTS}])
def test_probes_stay_within_the_budget_whenever_it_can_pay_for_the_floor(revisions, urgent, params) -> None:
    floor_cost = len(revisions) * PINNED_AT_FLOOR + 20 / 120  # every stream at its floor
    for allowed in [floor_cost * m for m in (1.0, 1.3, 2.0, 5.0, 50.0)]:
        assert planned_rate(allowed / 0.02, revisions, params, urgent) <= allowed * (1 + 1e-9)
    # below that the floor is spent anyway (an idle or tiny fleet is still measured), and no more than it
    assert planned_rate(floor_cost / 2 / 0.02, revisions, params, urgent) == pytest.approx(floor_cost)


def test_with_the_default_share_the_production_stream_gets_80_percent_of_what_is_left_when_both_want_more() -> None:
    floor = PINNED_AT_FLOOR + 20 / 120
    left = 2.0  # tokens/s beyond the floor; production wants 4 - 1/6, the pinned streams (20 + B4) (1/60 - 1/240)
    state = budget_state(snap(busy_capacity=(floor + left) / 0.02), SPLIT)
    streams_ = streams(snap(), SPLIT)
    production = [s for s in streams_ if s.key == PROD]
    pinned_ = [s for s in streams_ if s.key != PROD]
    assert cost(production, state.factor) == pytest.approx(20 / 120 + 0.8 * left)
    assert cost(pinned_, state.pinned_factor) == pytest.approx(PINNED_AT_FLOOR + 0.2 * left)
    # what one side does not want goes to the other: pinned streams that want less than 20% leave the rest
    tiny = (PromptSlot(GoldenPrompt(id="t", prompt="x", sampling=Sampling(max_tokens=1)), 1),)
    alone = ScheduleParams(**{**SPLIT.__dict__, "conditions": (1,)})  # a b1 stream of it alone: one row
    state = budget_state(snap({A: tiny}, busy_capacity=(floor + left) / 0.02), alone)
    assert state.pinned_factor == 1.0 and 1.0 < state.factor < math.inf


def test_fit_factor_finds_the_least_stretch_that_fits() -> None:
    group = [s for s in streams(snap(), PARAMS) if s.key != PROD]  # 20 + B4 tokens / 60 s, floors 240 s
    assert fit_factor(group, 10.0) == 1.0
    assert fit_factor(group, (20 + B4) / 120) == pytest.approx(2.0)
    assert fit_factor(group, PINNED_AT_FLOOR) == math.inf and fit_factor([], 0.0) == 1.0


URGENT_B4 = {pinned(A, 4): Urgency("suspect", "e2")}


PRODUCTION_WANTS = 20 / 5 - 20 / 120  # tokens/s the production stream wants beyond its floor


def test_an_urgent_stream_asks_for_its_urgent_interval_and_is_funded_after_the_production_stream() -> None:
    found = {s.key: s for s in streams(snap(urgent=URGENT_B4), PARAMS)}
    assert found[pinned(A, 4)].interval_s == 15.0 and found[pinned(A, 4)].floor_s == 240.0
    assert found[pinned(A, 1)].interval_s == 60.0 and found[pinned(A, 1)].urgent is None
    # the budget pays the floor, the production stream's 5 s, the b4 stream's B4 tokens / 15 s, and 0.1 more
    capacity = (PINNED_AT_FLOOR + 20 / 120 + PRODUCTION_WANTS + B4 / 15 - B4 / 240 + 0.1) / 0.02
    state = budget_state(snap(busy_capacity=capacity, urgent=URGENT_B4), PARAMS)
    assert state.factor == 1.0 and state.urgent_factor == 1.0 and state.urgent == frozenset(URGENT_B4)
    assert 1.0 < state.pinned_factor < math.inf  # the b1 stream: the 0.1 tokens/s of the 0.25 it wants
    history = {PROD: ago(1), pinned(A, 1): ago(1), pinned(A, 4): ago(15.01)}
    assert keys(plan(snap(busy_capacity=capacity, urgent=URGENT_B4, streams=history), PARAMS)) == [pinned(A, 4)]


def test_urgent_streams_stretch_toward_their_floor_when_the_budget_is_short() -> None:
    capacity = (PINNED_AT_FLOOR + 20 / 120 + PRODUCTION_WANTS + B4 / 30 - B4 / 240) / 0.02  # b4 every 30 s
    state = budget_state(snap(busy_capacity=capacity, urgent=URGENT_B4), PARAMS)
    assert state.factor == 1.0 and state.urgent_factor == pytest.approx(2.0) and state.pinned_factor == math.inf
    assert budget_state(snap(busy_capacity=0.0, urgent=URGENT_B4), PARAMS).urgent_factor == math.inf


def test_at_the_default_share_urgent_streams_keep_a_fifth_of_what_the_floor_leaves() -> None:
    left = 2.0  # beyond the floor: the production stream wants 3.83, the urgent b4 stream (B4/15 - B4/240)
    capacity = (PINNED_AT_FLOOR + 20 / 120 + left) / 0.02
    state = budget_state(snap(busy_capacity=capacity, urgent=URGENT_B4), SPLIT)
    found = streams(snap(urgent=URGENT_B4), SPLIT)
    urgent = [s for s in found if s.key == pinned(A, 4)]
    assert cost(urgent, state.urgent_factor) == pytest.approx(B4 / 240 + 0.2 * left)
    assert 1.0 < state.factor < math.inf and state.pinned_factor == math.inf


def test_at_the_default_shares_urgent_streams_claim_half_of_what_the_floor_leaves_first() -> None:
    left = 2.0  # beyond the floor: the production stream wants 3.83, the urgent b4 stream (B4/15 - B4/240)
    capacity = (PINNED_AT_FLOOR + 20 / 120 + left) / 0.02
    found = streams(snap(urgent=URGENT_B4), DEFAULTS)
    urgent = [s for s in found if s.key == pinned(A, 4)]
    production = [s for s in found if s.key == PROD]
    urgent_wants = B4 / 15 - B4 / 240
    state = budget_state(snap(busy_capacity=capacity, urgent=URGENT_B4), DEFAULTS)
    claimed = min(urgent_wants, 0.5 * left)
    assert cost(urgent, state.urgent_factor) == pytest.approx(B4 / 240 + claimed + 0.2 * (left - claimed))
    assert cost(production, state.factor) == pytest.approx(20 / 120 + 0.8 * (left - claimed))
    # no urgent stream: the production stream gets its 80% of all that is left, as before
    calm = budget_state(snap(busy_capacity=capacity), DEFAULTS)
    assert cost(production, calm.factor) == pytest.approx(20 / 120 + 0.8 * left)


def test_an_urgent_claim_it_does_not_need_goes_to_the_others() -> None:
    left = 50.0  # far more than the urgent b4 stream wants
    capacity = (PINNED_AT_FLOOR + 20 / 120 + left) / 0.02
    state = budget_state(snap(busy_capacity=capacity, urgent=URGENT_B4), DEFAULTS)
    assert state.urgent_factor == 1.0 and state.factor == 1.0 and state.pinned_factor == 1.0


def test_a_suspect_stream_is_pinned_to_the_engine_of_its_bad_probe_while_it_is_ready() -> None:
    targets = ModelTargets("m", {A: PROMPTS}, PROMPTS, engines={A: ("e1", "e2", "e3")})
    for index in range(3):
        history = {key: ago(1e6, index) for key in (PROD, pinned(A, 1), pinned(A, 4))}
        snapshot = ScheduleSnapshot(now=NOW, enabled=True, models=(targets,), busy_capacity=1e9, streams=history,
                                    urgent=URGENT_B4)
        planned = {p.stream: p.engine for p in plan(snapshot, PARAMS)}
        assert planned[pinned(A, 4)] == "e2"
        # when b1's walk comes to e2 as well, e2 takes the suspect b4 (the more overdue at its urgent
        # interval) and b1 waits for its next turn
        assert planned.get(pinned(A, 1)) == ("e1", None, "e3")[index]
    gone = ModelTargets("m", {A: PROMPTS}, PROMPTS, engines={A: ("e1", "e3")})  # e2 is no longer ready: walk
    snapshot = ScheduleSnapshot(now=NOW, enabled=True, models=(gone,), busy_capacity=1e9, urgent=URGENT_B4)
    assert {p.stream: p.engine for p in plan(snapshot, PARAMS)}[pinned(A, 4)] == "e3"  # from its lane, 1


def test_stream_urgency_warming_suspect_or_none() -> None:
    assert stream_urgency(None, 10) == Urgency("warming")
    assert stream_urgency(StreamState(divergence=CusumState(probes=9)), 10) == Urgency("warming")
    assert stream_urgency(StreamState(divergence=CusumState(probes=10)), 10) is None
    raised = StreamState(divergence=CusumState(probes=50, steps=3))
    assert stream_urgency(raised, 10, "e2") == Urgency("suspect", "e2")
    alarmed = StreamState(divergence=CusumState(probes=50, alarmed_at=NOW))  # statistic restarted, alarm in force
    assert stream_urgency(alarmed, 10) == Urgency("suspect")
    wrong = StreamState(divergence=CusumState(probes=50), answer=CusumState(steps=1))
    assert stream_urgency(wrong, 10).reason == "suspect"  # type: ignore[union-attr]


def test_a_revision_at_its_floor_gets_one_pinned_probe_per_floor_interval_over_its_conditions() -> None:
    floors = {s.key: s.floor_s for s in streams(snap(), PARAMS)}
    assert floors == {PROD: 120.0, pinned(A, 1): 240.0, pinned(A, 4): 240.0}
    assert longest_floor_interval(PARAMS) == 240.0


def test_a_revision_is_probed_only_at_the_conditions_its_reference_recorded() -> None:
    targets = ModelTargets("m", {A: PROMPTS, B: PROMPTS}, PROMPTS, conditions={A: (1,), B: (8, 16)})
    snapshot = ScheduleSnapshot(now=NOW, enabled=True, models=(targets,), busy_capacity=1e9)
    found = {s.key: s.floor_s for s in streams(snapshot, PARAMS)}
    # A recorded b1 only: one pinned stream, its floor the whole 120 s; B recorded none of (1, 4): both
    assert found == {PROD: 120.0, pinned(A, 1): 120.0, pinned(B, 1): 240.0, pinned(B, 4): 240.0}
    assert revision_conditions(targets, "unknown@r9", PARAMS) == (1, 4)


def test_an_idle_fleet_is_probed_at_the_floor_rate() -> None:
    state = budget_state(snap(busy_capacity=0.0, spent_tokens=5000.0), PARAMS)
    assert state.factor == math.inf and state.allowed == 0.0 and state.share == 0.0
    history = {PROD: ago(119), pinned(A, 1): ago(239), pinned(A, 4): ago(240)}
    assert keys(plan(snap(busy_capacity=0.0, streams=history), PARAMS)) == [pinned(A, 4)]
    assert seconds_to_next_due(snap(busy_capacity=0.0, streams=history), PARAMS) == 0.0


def test_the_share_is_the_measured_probe_rate_over_the_busy_capacity() -> None:
    state = budget_state(snap(busy_capacity=1000.0, spent_tokens=3000.0), PARAMS)
    assert state.share == pytest.approx(3000 / 300 / 1000)


def test_the_floor_never_shortens_a_longer_configured_interval() -> None:
    assert effective_interval(300.0, 2.0, 120.0) == 300.0
    assert effective_interval(60.0, math.inf, 120.0) == 120.0
    assert effective_interval(5.0, 1.0, 120.0) == 5.0


def test_prompt_token_estimates() -> None:
    assert estimate_prompt_tokens(GoldenPrompt(id="c", prompt="x" * 40)) == 11
    chat = GoldenPrompt(id="c", messages=[{"role": "user", "content": "x" * 40}])
    assert estimate_prompt_tokens(chat) == 11 + 8


def test_plan_is_deterministic() -> None:
    snapshot = snap({A: PROMPTS, B: PROMPTS}, streams={PROD: ago(30), pinned(B, 4): ago(70)})
    assert plan(snapshot, PARAMS) == plan(snapshot, PARAMS)


def test_pinned_probes_walk_the_revisions_engines_and_the_production_path_pins_none() -> None:
    targets = ModelTargets("m", {A: PROMPTS}, PROMPTS, engines={A: ("e1", "e2")})
    base = ScheduleSnapshot(now=NOW, enabled=True, models=(targets,), busy_capacity=1e9)
    seen = []
    for turn in range(4):  # the b4 stream's walk moves 4 prompts a turn (4 rows each)
        history = {PROD: ago(1e6, turn), pinned(A, 1): ago(1e6, turn), pinned(A, 4): ago(1e6, 4 * turn)}
        planned = {p.stream: p for p in plan(ScheduleSnapshot(**{**base.__dict__, "streams": history}), PARAMS)}
        assert planned[PROD].engine is None
        seen.append((planned[pinned(A, 1)].engine, planned[pinned(A, 4)].engine))
    # b4 walks from the second engine (its lane), so the two streams are never on one engine at once
    assert seen == [("e1", "e2"), ("e2", "e1"), ("e1", "e2"), ("e2", "e1")]


def test_an_engine_serves_one_pinned_probe_at_a_time() -> None:
    """A b1 probe beside a b4 probe on one engine would run in one batch of 5: neither would measure its
    condition. The one less overdue waits; an engine busy with a probe in flight takes none."""
    one = ModelTargets("m", {A: PROMPTS}, PROMPTS, engines={A: ("e1",)})
    history = {PROD: ago(1e6), pinned(A, 1): ago(1e6), pinned(A, 4): ago(2e6)}
    snapshot = ScheduleSnapshot(now=NOW, enabled=True, models=(one,), busy_capacity=1e9, streams=history)
    assert keys(plan(snapshot, PARAMS)) == [PROD, pinned(A, 4)]  # b4 is the more overdue
    busy = ScheduleSnapshot(**{**snapshot.__dict__, "busy_engines": frozenset({"e1"})})
    assert keys(plan(busy, PARAMS)) == [PROD]  # the production path is routed as users are: not held
    assert seconds_to_next_due(busy, PARAMS) == 0.0  # still due: planned once e1 is free


def test_a_revision_whose_engines_are_not_known_is_pinned_to_none() -> None:
    (probe,) = [p for p in plan(snap(), PARAMS) if p.stream == pinned(A, 1)]
    assert probe.engine is None


def test_the_probes_in_flight_count_against_the_concurrency_whatever_their_streams() -> None:
    params = ScheduleParams(**{**PARAMS.__dict__, "concurrency": 3})
    # the production stream has two probes in flight but is not saturated: it is still planned, once
    planned = plan(snap(in_flight=frozenset(), in_flight_count=2), params)
    assert keys(planned) == [PROD]
    assert plan(snap(in_flight=frozenset(), in_flight_count=3), params) == []


def test_a_stream_whose_newest_probe_failed_is_due_again_at_its_configured_interval_not_the_stretched_one() -> None:
    """No capacity measured: every stream is stretched to its floor (pinned: 2 conditions x 120 s). A stream
    whose probe failed (say, the gateways did not route a new revision yet) spent nothing and retries at its
    own interval."""
    history = {PROD: ago(30), pinned(A, 1): ago(61), pinned(A, 4): StreamHistory(NOW - timedelta(seconds=61), 0, True)}
    snapshot = snap(busy_capacity=0.0, streams=history)
    assert keys(plan(snapshot, PARAMS)) == [pinned(A, 4)]  # 61 s > its 60 s; b1 waits for its 240 s floor
    # sent 1 s ago: a good probe leaves the production stream's floor (120 - 30 s) the next due; a failed one
    # its own 60 s interval
    assert seconds_to_next_due(snap(busy_capacity=0.0, streams={**history, pinned(A, 4): ago(1)}), PARAMS) == 90.0
    retrying = {**history, pinned(A, 4): StreamHistory(NOW - timedelta(seconds=1), 0, True)}
    assert seconds_to_next_due(snap(busy_capacity=0.0, streams=retrying), PARAMS) == 59.0
