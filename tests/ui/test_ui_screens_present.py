"""What the Rollouts, Quality, Traffic and Events screens draw, as pure functions (ui/present): rows, the
rollout detail, gates against thresholds, the canary grid with "not measured", gateways against the
controller's generation, the event filter, countdowns with a moved clock, and the weights' checks."""

from __future__ import annotations

from datetime import timedelta

import pytest
from uiscreens_data import MODEL, OTHER, T0, drill, events, finished_rollout, gateways, paused_rollout, streams, traffic

from fleetctl.controller.watch_contract import key_of
from ui.present import events as ev
from ui.present import quality, rollouts
from ui.present import traffic as tr
from ui.present.timefmt import Countdowns, duration
from ui.widgets.weights import WeightsError, parse_weights


def test_durations_read_compactly() -> None:
    assert [duration(s) for s in (0, 4.6, 59.4, 60, 95, 3599, 3600, 3725, 90000)] == [
        "0s", "5s", "59s", "1m00s", "1m35s", "59m59s", "1h00m", "1h02m", "1d01h"]
    assert duration(None) == "—"


def test_a_countdown_runs_from_when_its_value_was_first_seen() -> None:
    clock = Countdowns()
    clock.observe("7", 95.0, T0)
    assert clock.left("7", T0 + timedelta(seconds=10)) == 85.0
    clock.observe("7", 95.0, T0 + timedelta(seconds=10))  # the same value again (a repeated snapshot)
    assert clock.left("7", T0 + timedelta(seconds=20)) == 75.0
    clock.observe("7", 60.0, T0 + timedelta(seconds=30))  # a new value restarts it
    assert clock.left("7", T0 + timedelta(seconds=31)) == 59.0
    assert clock.left("7", T0 + timedelta(hours=1)) == 0.0
    clock.observe("7", None, T0)
    assert clock.left("7", T0) is None
    clock.observe("8", 5.0, T0)
    clock.keep_only([])
    assert clock.left("8", T0) is None


def test_rollouts_active_first_then_finished_dimmed() -> None:
    rows = rollouts.rows([finished_rollout(), paused_rollout()], {"7": 95.0})
    assert [key for key, _ in rows] == ["7", "3"]
    active, done = rows[0][1], rows[1][1]
    assert [c.plain for c in active] == ["7", MODEL, "chat@r1 -> chat@r2", "॥ paused", "3/5", "10%", "1m35s"]
    assert [c.plain for c in done][3:5] == ["✔ completed", "2/2"]
    assert all("dim" in str(span.style) for cell in done for span in cell.spans)


def test_the_detail_marks_the_current_step_and_counts_the_pause_down() -> None:
    mine = [e for e in events() if e.subject == "rollouts/7"]
    text = rollouts.detail(paused_rollout(), 83.0, rollouts.events_of(paused_rollout(), events())).plain
    assert text.startswith("॥ paused: pause step, 1m23s left\n")
    assert "▶ 2: pause 2m  1m23s left" in text
    assert "✔ 1: setWeight 10" in text and "  3: analysis latency" in text
    assert "weights chat@r1=90 chat@r2=10 · B asks 10% · ✔ on every gateway" in text
    assert "engines A chat@r1 2/2 ready · B chat@r2 2/2 ready" in text
    assert text.endswith("events\n  09:17:13 started: chat@r1 -> chat@r2 (alice)\n  09:17:33 paused: CanaryPauseStep")
    assert len(mine) == 2 and rollouts.title(paused_rollout()) == f"rollout 7: {MODEL} chat@r1 -> chat@r2"


def test_gates_show_the_value_against_the_threshold() -> None:
    view = paused_rollout()
    (latency, latency_counts), (errors, error_counts) = (rollouts.gate_lines(view, gate) for gate in view.gates)
    assert latency.plain == "  ◌ ttft p90  0.41 s ≤ 0.46 s (1.2 × A 0.38 s)"
    assert latency_counts.plain == "      latency/ttft · Running · ✔ 2 · failed 0/0 · next 8s"
    assert errors.plain == "  ◌ error rate  2%, needs < 1%" and error_counts.plain.endswith("failed 1/2")
    no_value = view.gates[0].model_copy(update={"latest": None})
    assert rollouts.comparison(view, no_value).plain == "no measurement yet"


def _grid() -> tuple[list[str], list[quality.GridRow], dict]:
    keyed = {key_of("canary_stream", s.model_dump(mode="json")): s for s in streams()}
    cols, rows = quality.grid(keyed)
    return cols, rows, keyed


def test_the_canary_grid_has_a_row_per_revision_and_production_per_model() -> None:
    cols, rows, keyed = _grid()
    assert cols == ["b1", "b4", "b8", "b16", "mixed"]
    assert [(r.model, r.revision, r.label) for r in rows] == [
        (OTHER, "production", OTHER), (OTHER, "tiny@r5", "  tiny@r5"),
        (MODEL, "production", MODEL), (MODEL, "chat@r1", "  chat@r1"), (MODEL, "chat@r2", "  chat@r2")]
    cells = {(r.model, r.revision): [c.plain for c in quality.cells(r, cols, keyed)[1:]] for r in rows}
    assert cells[(MODEL, "chat@r1")] == ["✔ healthy"] * 4 + ["·"]
    assert cells[(MODEL, "chat@r2")] == ["◆ drifting", "not measured", "✖ failing", "not measured", "·"]
    assert cells[(MODEL, "production")] == ["·"] * 4 + ["◆ drifting"]
    assert cells[(OTHER, "production")] == ["·"] * 4 + ["not measured"]  # not sent: still not measured
    narrow = [c.plain for c in quality.cells(rows[-1], cols, keyed, narrow=True)[1:]]
    assert narrow == ["◆ drifting", "not\nmeasured", "✖ failing", "not\nmeasured", "·"]  # 80 columns


def test_not_measured_is_never_green_and_never_blank() -> None:
    for verdict in (None, streams()[5]):  # missing, and sent as not_measured
        text = quality.verdict_text(verdict)
        assert text.plain == "not measured" and "green" not in str(text.style)


def test_the_evidence_of_a_stream() -> None:
    _, rows, keyed = _grid()
    chat_r2 = next(r for r in rows if r.revision == "chat@r2")
    key = quality.stream_at(chat_r2, "b8")
    text = quality.evidence(keyed[key], "x").plain
    assert "divergence statistic 7.9 vs threshold 5  (over)" in text
    assert "bad 9 of 40 probes; first divergence at token 3" in text
    assert "blamed: chat@r2 chat-2" in text and "arith-3 (5)" in text
    assert quality.stream_at(chat_r2, "b16") is None  # expected, not sent: not measured
    assert quality.stream_at(chat_r2, None) == quality.stream_at(chat_r2, "mixed") == chat_r2.cells["b1"]
    assert quality.evidence(None, f"{MODEL} chat@r2 b16").plain.startswith(f"{MODEL} chat@r2 b16: not measured")


def test_no_canary_data_says_not_measured_and_why() -> None:
    assert quality.no_data({}).plain.startswith("not measured: no canary streams yet")
    from fleetctl.controller.responses import FlagView

    off = {"canary_probes": FlagView(value=False, updated_at="x", updated_by="alice")}
    assert "canary probes are off" in quality.no_data(off).plain


def test_traffic_rows_and_the_drill_on_top_of_them() -> None:
    views = {v.model: v for v in traffic()}
    rows = tr.revision_rows(views)
    assert [key for key, _ in rows] == [f"{OTHER}/tiny@r5", f"{MODEL}/chat@r1", f"{MODEL}/chat@r2", f"{MODEL}/chat@r3"]
    chat_r3 = [c.plain for c in rows[3][1]]
    assert chat_r3[1] == "chat@r3 ⚑ drill" and chat_r3[3] == "░░░░░░░░    0%"
    assert [c.plain for c in rows[1][1]][3] == "███████░   90%"
    assert [c.plain for c in rows[0][1]][5] == "(equal)"
    line = tr.drill_lines(views, T0 + timedelta(seconds=480))[0].plain
    assert "misroute 15%" in line and "10m00s left" in line and "fleetctl drill stop 4" in line


def test_gateways_against_the_controller_generation() -> None:
    keyed = {g.name: g for g in gateways()}
    rows = {key: [c.plain for c in cells] for key, cells in tr.gateway_rows(keyed, 42)}
    assert rows["gw-a"][3:5] == ["42 = 42", "live"]
    assert rows["gw-b"][3:5] == ["41 < 42", "live"]
    assert rows["gw-c"][3:5] == ["37", "stale"]  # a stale gateway is not held to the generation
    assert tr.gateway_summary(keyed.values(), 42).plain == "generation 42 applied by 1/2 live · 1 stale"
    assert "not known yet" in tr.gateway_summary(keyed.values(), None).plain
    assert tr.gateway_rows(keyed, None)[0][1][3].plain == "42"


@pytest.mark.parametrize(("text", "ids"), [
    ("", ["audit:1", "rollout:2", "canary:3", "rollout:4", "audit:5", "canary:6"]),
    ("source:canary", ["canary:3", "canary:6"]),
    ("severity:alert", ["canary:3", "audit:5"]),
    ("sev:warn", ["rollout:4"]),
    ("source:canary severity:alert", ["canary:3"]),
    ("!source:audit rollout", ["rollout:2", "rollout:4"]),
    ("ALICE", ["audit:1", "rollout:2"]),
    ("chat@r2 b8", ["canary:3"]),
    ("subject:rollouts/7", ["rollout:2", "rollout:4"]),
])
def test_the_event_filter(text: str, ids: list[str]) -> None:
    assert [e.id for e in ev.select(events(), ev.parse_filter(text))] == ids


def test_an_event_line_is_coloured_by_severity() -> None:
    alert = ev.line(events()[2])
    assert alert.plain == "09:17:23 alert   canary  chat@r2  b8: healthy -> failing: divergence 7.9 over 5"
    assert any("orange_red1" in str(span.style) for span in alert.spans)
    assert ev.line(events()[0]).plain.endswith("(alice)")


def test_weights_are_checked_naming_the_field() -> None:
    current = {"chat@r1": 90.0, "chat@r2": 10.0, "chat@r3": 0.0}
    assert parse_weights({"chat@r1": "50", "chat@r2": "50", "chat@r3": "0"}, current) == {"chat@r1": 50, "chat@r2": 50}
    assert parse_weights({"chat@r1": "100", "chat@r2": "0", "chat@r3": "0"}, current) == {"chat@r1": 100, "chat@r2": 0}
    for texts, field, words in [
        ({"chat@r1": "ten", "chat@r2": "0"}, "chat@r1", "'ten' is not a number"),
        ({"chat@r1": "10", "chat@r2": "-1"}, "chat@r2", "finite number >= 0"),
        ({"chat@r1": "10", "chat@r2": "inf"}, "chat@r2", "finite number >= 0"),
        ({"chat@r1": "10", "chat@r2": ""}, "chat@r2", "give a weight"),
        ({"chat@r1": "0", "chat@r2": "0"}, "chat@r1", "at least one revision"),
    ]:
        with pytest.raises(WeightsError) as caught:
            parse_weights(texts, current)
        assert caught.value.field == field and words in str(caught.value) and str(caught.value).startswith(field)


def test_drills_in_the_quality_screen_count_down() -> None:
    line = quality.drill_lines([drill(), drill(active=False)], T0 + timedelta(seconds=1015))
    assert len(line) == 1 and line[0].plain.endswith("1m05s left")


def test_the_production_probes_a_revision_served_fill_its_mixed_cell() -> None:
    served = next(s for s in streams() if s.kind == "production" and s.model == MODEL).model_copy(
        update={"class_ref": "chat@r2", "verdict": "failing"})
    keyed = {key_of("canary_stream", s.model_dump(mode="json")): s for s in [*streams(), served]}
    cols, rows = quality.grid(keyed)
    cells = {(r.model, r.revision): [c.plain for c in quality.cells(r, cols, keyed)[1:]] for r in rows}
    assert cells[(MODEL, "chat@r2")][-1] == "✖ failing" and cells[(MODEL, "chat@r1")][-1] == "·"
    assert cells[(MODEL, "production")] == ["·"] * 4 + ["◆ drifting"]  # the model's own stream is still there
    chat_r2 = next(r for r in rows if r.revision == "chat@r2")
    text = quality.evidence(keyed[quality.stream_at(chat_r2, "mixed")], "x").plain
    assert text.startswith(f"{MODEL} production served by chat@r2 (mixed)")
