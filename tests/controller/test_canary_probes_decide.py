"""The probe reconciler's pure decision: probes paired with gateways, and when to run again."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from fleetctl.canary.schedule import ModelTargets, PromptSlot, ScheduleParams, ScheduleSnapshot, StreamHistory
from fleetctl.canary.types import GoldenPrompt, StreamKey
from fleetctl.controller.canary_probes import (
    BLOCKED_RETRY_S,
    MAX_REQUEUE_S,
    CanaryProbeSnapshot,
    decide_probes,
)

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
PROMPTS = (PromptSlot(GoldenPrompt(id="p0", prompt="hi"), 2), PromptSlot(GoldenPrompt(id="p1", prompt="yo"), 2))
PARAMS = ScheduleParams(pinned_interval_s=60.0, production_interval_s=5.0, floor_interval_s=120.0, budget_share=0.02,
                        budget_window_s=300.0, concurrency=2, conditions=(1,))
PROD, PINNED = StreamKey("m", "production"), StreamKey("m", "pinned", "c@r1", 1)


def snapshot(gateways: tuple[str, ...] = ("http://a", "http://b"), **changes: object) -> CanaryProbeSnapshot:
    values: dict[str, object] = {"now": NOW, "enabled": True, "busy_capacity": 1e9,
                                 "models": (ModelTargets("m", {"c@r1": PROMPTS}, PROMPTS),)}
    values.update(changes)
    return CanaryProbeSnapshot(ScheduleSnapshot(**values), gateways, NOW - timedelta(days=7))  # type: ignore[arg-type]


def test_planned_probes_go_through_the_live_gateways_and_advance_their_prompt() -> None:
    decision = decide_probes(snapshot(), PARAMS)
    assert [(p.stream, url in ("http://a", "http://b")) for p, url in decision.probes] == [(PROD, True), (PINNED, True)]
    assert decision.next_index == {PROD: 1, PINNED: 1}
    assert decision.requeue_after == pytest.approx(5.0)  # the production stream's interval
    assert decide_probes(snapshot(), PARAMS) == decision  # pure


def test_no_gateway_no_probes() -> None:
    decision = decide_probes(snapshot(gateways=()), PARAMS)
    assert decision.probes == () and decision.requeue_after is None


def test_every_slot_taken_looks_again_soon() -> None:
    decision = decide_probes(snapshot(in_flight=frozenset({PROD, PINNED})), PARAMS)
    assert decision.probes == () and decision.requeue_after == BLOCKED_RETRY_S


def test_the_next_run_is_at_most_max_requeue_away() -> None:
    quiet = {PROD: StreamHistory(NOW, 0), PINNED: StreamHistory(NOW, 0)}
    params = ScheduleParams(**{**PARAMS.__dict__, "production_interval_s": 60.0})
    assert decide_probes(snapshot(streams=quiet), params).requeue_after == MAX_REQUEUE_S


def test_the_flag_off_plans_nothing_and_keeps_the_interval() -> None:
    decision = decide_probes(snapshot(enabled=False), PARAMS)
    assert decision.probes == () and decision.requeue_after is None and not decision.enabled
