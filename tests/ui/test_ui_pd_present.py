"""The P:D screen's content from the API's answers: a model row per model (ratio, queues, advice, the
rebalance in progress), its engines by role, and the planner's reasoning line by line."""

from __future__ import annotations

from fleetctl.controller.pd_responses import PdModelView
from ui import actions
from ui.present import pd as present


def model(**changes) -> PdModelView:
    base = {
        "model": "smollm2-135m", "class_ref": "chat@r1", "class_refs": ["chat@r1"],
        "ratio": {"prefill": 1, "decode": 3, "mixed": 0}, "mode": "advisory",
        "settings": {"ttft_slo_s": 2.0}, "profile": {"source": "default"},
        "engines": [
            {"name": "chat-decode-0", "node": "n1", "role": "decode", "state": "ready", "class_ref": "chat@r1",
             "draining": False, "running": 3, "waiting": 2, "kv_cache_usage": 0.5},
            {"name": "chat-prefill-0", "node": "n1", "role": "prefill", "state": "ready", "class_ref": "chat@r1",
             "draining": True, "running": 1, "waiting": 4, "kv_cache_usage": 0.1},
        ],
        "recommendation": {"measured": True, "current": {"prefill": 1, "decode": 3, "mixed": 0},
                           "recommended": {"prefill": 2, "decode": 2, "mixed": 0}, "action": "hold", "changes": True,
                           "blocked_by": "the fleet is frozen", "prefill_need": 1.8, "decode_need": 1.9,
                           "ideal_prefill": 1.9, "reasons": ["prefill: ...", "decode: ...", "-> 2P:2D"]},
        "rebalance": None,
    }
    return PdModelView.model_validate({**base, **changes})


def test_a_model_row_shows_ratio_queues_and_held_advice() -> None:
    ((key, cells),) = present.model_rows([model()])
    assert key == "smollm2-135m"
    text = [c.plain for c in cells]
    assert text[2] == "1P:3D" and text[3] == "4" and text[4] == "2"
    assert text[6] == "→ 2P:2D (held: the fleet is frozen)" and text[7] == "-"


def test_a_rebalance_under_way_shows_its_flips_done_of_needed_first() -> None:
    flip = {"engine": "chat-prefill-0", "from_role": "prefill", "to_role": "decode", "phase": "done",
            "started_at": "t", "done_at": "t", "ttft_p90_s": None, "itl_p90_s": None}
    rebalance = {"id": 7, "model": "smollm2-135m", "class_ref": "chat@r1", "phase": "flipping",
                 "target": {"prefill": 2, "decode": 2, "mixed": 0}, "paused_by": None, "message": "", "reason": None,
                 "created_at": "t", "created_by": "alice", "updated_at": "t", "stop_requested": None, "slo": {},
                 "baseline": {}, "flips": [flip], "version": 1}
    # 1P:3D now, one flip done already: one more to reach 2P:2D
    ((_, cells),) = present.model_rows([model(rebalance=rebalance)])
    assert cells[7].plain == "#7 1/2 → 2P:2D flipping"


def test_unmeasured_advice_is_never_shown_as_hold() -> None:
    unmeasured = model(recommendation={**model().recommendation.model_dump(), "measured": False})
    assert present.advice(unmeasured.recommendation).plain == "not measured"
    assert present.advice(None).plain == "not measured"


def test_engines_by_role_and_the_reasoning() -> None:
    rows = present.engine_rows(model())
    assert [k for k, _ in rows] == ["chat-decode-0", "chat-prefill-0"]
    assert rows[1][1][3].plain == "ready (draining)"
    lines = present.reasoning(model()).plain.splitlines()
    assert lines[0].startswith("smollm2-135m  mode advisory") and lines[-1] == "  -> 2P:2D"


def test_the_actions_are_the_cli_commands() -> None:
    assert actions.rebalance("m", 2, 2).command == (
        "fleetctl pd rebalance m --prefill 2 --decode 2 --apply --no-wait --yes --reason '<reason>'")
    assert actions.stop_rebalance("m", 7).command == "fleetctl pd stop 7 --reason '<reason>'"
