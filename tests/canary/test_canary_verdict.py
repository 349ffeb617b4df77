"""Folding probes into a stream: not measured until enough probes, drifting and failing on alarms, held until
the recovery run, `since`, failed probes skipped; evidence and blame; class_quality for the rollout gate."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from fleetctl.canary import cusum
from fleetctl.canary.types import ProbeRecord, Score, StreamKey, StreamState, StreamVerdict
from fleetctl.canary.verdict import (
    RECENT, StreamDesigns, blame, class_quality, evidence, fold, fold_changes, stream_verdict, unmeasured,
)

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
DESIGNS = StreamDesigns(cusum.design(0.05, 0.15, 1000.0), cusum.design(0.02, 0.15, 1000.0))  # h 24/9, 26/14
MIN, RECOVERY = 10, 20


class Probes:
    """Numbered probes, a second apart."""

    def __init__(self) -> None:
        self.next_id = 0

    def make(self, diverged: bool = False, answer_bad: bool | None = None, *, failed: bool = False,
             class_ref: str = "chat@r1", engine: str | None = "e1", kind: str = "pinned",
             prompt_id: str = "p1", first_divergence: int | None = None) -> ProbeRecord:
        self.next_id += 1
        score = None if failed else Score(match=not diverged, first_divergence=first_divergence if diverged else None,
                                          distance=0.5 if diverged else 0.0, diverged=diverged, answer_bad=answer_bad)
        return ProbeRecord(id=self.next_id, at=T0 + timedelta(seconds=self.next_id), model="m", kind=kind,
                           class_ref=class_ref, engine=engine, condition=1, prompt_id=prompt_id, score=score,
                           error="timeout" if failed else None)

    def many(self, n: int, **kw: object) -> list[ProbeRecord]:
        return [self.make(**kw) for _ in range(n)]  # type: ignore[arg-type]


def run(state: StreamState, probes: list[ProbeRecord]) -> StreamState:
    return fold(state, probes, DESIGNS, T0, min_probes=MIN, recovery_probes=RECOVERY)


def test_not_measured_until_min_probes_then_healthy() -> None:
    p = Probes()
    state = run(StreamState(), p.many(MIN - 1))
    assert state.verdict == "not_measured" and state.since == T0
    state = run(state, p.many(1))
    assert state.verdict == "healthy" and state.since == T0 + timedelta(seconds=MIN)
    assert state.last_probe_id == MIN and state.recent == list(range(1, MIN + 1))


def test_failed_probes_are_skipped_but_the_cursor_moves_past_them() -> None:
    p = Probes()
    state = run(StreamState(), p.many(MIN + 5, failed=True))
    assert state.verdict == "not_measured" and state.divergence.probes == 0 and state.last_probe_id == MIN + 5
    assert state.recent == []


def test_probes_already_folded_are_not_folded_twice() -> None:
    p = Probes()
    batch = p.many(MIN)
    once = run(StreamState(), batch)
    assert run(once, batch) == once


def test_divergence_alarm_drifts_holds_then_recovers() -> None:
    p = Probes()
    state = run(StreamState(), p.many(MIN))
    state, changes = fold_changes(state, p.many(3, diverged=True), DESIGNS, T0, min_probes=MIN, recovery_probes=RECOVERY)
    assert state.verdict == "drifting" and state.divergence.alarmed_at == T0 + timedelta(seconds=MIN + 3)
    assert [(c.verdict_from, c.verdict_to, c.probe_id) for c in changes] == [("healthy", "drifting", MIN + 3)]
    assert state.since == T0 + timedelta(seconds=MIN + 3)
    held = run(state, p.many(RECOVERY - 1))
    assert held.verdict == "drifting" and held.divergence.steps == 0  # the statistic restarted, the verdict holds
    reset = run(held, [p.make(diverged=True)] + p.many(RECOVERY - 1))  # one bad probe restarts the count
    assert reset.verdict == "drifting" and reset.clean_run == RECOVERY - 1
    recovered = run(reset, p.many(1))
    assert recovered.verdict == "healthy" and recovered.divergence.alarmed_at is None
    assert recovered.since == T0 + timedelta(seconds=p.next_id)


def test_an_alarm_before_min_probes_shows_at_once() -> None:
    p = Probes()
    state = run(StreamState(), p.many(2, diverged=True))
    assert state.verdict == "not_measured" and state.divergence.alarmed_at is None  # below the threshold
    state = run(state, p.many(1, diverged=True))  # 3 of 3 bad: the CUSUM crosses, 7 probes short of MIN
    assert state.verdict == "drifting" and state.divergence.alarmed_at is not None
    state = run(state, p.many(RECOVERY))
    assert state.verdict == "healthy"  # recovered, and measured by now (3 + RECOVERY >= MIN)


def test_wrong_answers_fail_and_failing_outranks_drifting() -> None:
    p = Probes()
    state = run(StreamState(), p.many(MIN, answer_bad=False))
    state = run(state, p.many(2, diverged=True, answer_bad=True))  # 26 steps: 2 x 13 on the answer grid
    assert state.verdict == "failing" and state.answer.alarmed_at is not None
    state = run(state, p.many(3, diverged=True, answer_bad=False))  # now the divergence test alarms too
    assert state.divergence.alarmed_at is not None and state.verdict == "failing"
    state = run(state, p.many(RECOVERY, answer_bad=False))
    assert state.verdict == "healthy"


def test_a_full_batch_with_an_alarm_and_a_recovery_reports_both_changes() -> None:
    p = Probes()
    probes = p.many(MIN) + p.many(3, diverged=True) + p.many(RECOVERY)
    state, changes = fold_changes(StreamState(), probes, DESIGNS, T0, min_probes=MIN, recovery_probes=RECOVERY)
    assert [(c.verdict_from, c.verdict_to) for c in changes] == [
        ("not_measured", "healthy"), ("healthy", "drifting"), ("drifting", "healthy")]
    assert state.verdict == "healthy"


def test_recent_and_trend_keep_the_window() -> None:
    p = Probes()
    state = run(StreamState(), p.many(RECENT + 10) + [p.make(diverged=True)])
    assert len(state.recent) == len(state.trend) == RECENT and state.recent[-1] == p.next_id
    assert state.trend[-1] == pytest.approx(8 / 9) and state.trend[-2] == 0.0


def test_a_new_noise_bound_regrids_the_statistic() -> None:
    p = Probes()
    state = run(StreamState(), p.many(MIN) + p.many(2, diverged=True))  # 16 steps of 1/9
    assert state.p0 == 0.05 and state.divergence.steps == 16
    noisier = StreamDesigns(cusum.design(0.10, 0.15, 1000.0), None)  # m 6
    moved = fold(state, [], noisier, T0, min_probes=MIN, recovery_probes=RECOVERY)
    assert moved.divergence.steps == round(16 * 6 / 9) and moved.p0 == 0.10 and moved.answer_p0 is None


def test_unmeasured_starts_afresh_and_keeps_the_cursor() -> None:
    p = Probes()
    state = run(StreamState(), p.many(MIN))
    later = T0 + timedelta(hours=1)
    gone = unmeasured(state, later)
    assert (gone.verdict, gone.since, gone.last_probe_id, gone.divergence.probes) == ("not_measured", later, MIN, 0)
    assert unmeasured(gone, later + timedelta(hours=1)) == gone


def test_evidence_names_the_bad_prompts_and_the_first_divergence() -> None:
    p = Probes()
    probes = p.many(MIN) + [p.make(diverged=True, prompt_id="sum", first_divergence=3),
                            p.make(diverged=True, prompt_id="sum", first_divergence=5),
                            p.make(diverged=True, prompt_id="capital", first_divergence=7)]
    state = run(StreamState(), probes)
    ev = evidence(state, DESIGNS, probes)
    assert ev.bad_prompts == {"sum": 2, "capital": 1} and ev.first_divergence == 3
    assert (ev.probes, ev.bad) == (MIN + 3, 3)
    assert ev.statistic == pytest.approx(24 / 9) == ev.threshold  # three bad probes in a row: the alarm
    assert ev.answer_threshold == pytest.approx(26 / 14) and ev.served_by == {"chat@r1 e1": 3}
    assert ev.trend == state.trend


def test_blame_names_the_class_beyond_its_noise_and_the_dominant_engine() -> None:
    p = Probes()
    majority = p.many(80, class_ref="a@r1", engine="a-0") + p.many(4, diverged=True, class_ref="a@r1", engine="a-0")
    misrouted = p.many(10, class_ref="long@r1", engine="l-0") + p.many(3, diverged=True, class_ref="long@r1", engine="l-0")
    # a@r1 served more bad probes (4) but no more than its noise (0.05 x 84); long@r1's 3 of 13 are beyond it
    assert blame(majority + misrouted, p0=0.05) == "long@r1 l-0"
    spread = p.many(3, diverged=True, class_ref="long@r1", engine="l-1")
    assert blame(majority + misrouted + spread, p0=0.05) == "long@r1"  # no engine served most of them
    assert blame(p.many(50, class_ref="a@r1"), p0=0.05) is None


def test_the_production_stream_verdict_names_what_it_blames_only_when_alarmed() -> None:
    p = Probes()
    key = StreamKey("m", "production")
    probes = p.many(MIN, kind="production", class_ref="a@r1") + p.many(3, diverged=True, kind="production", class_ref="b@r2")
    state = run(StreamState(), probes)
    view = stream_verdict(key, state, DESIGNS, probes)
    assert (view.verdict, view.blamed) == ("drifting", "b@r2 e1") and view.evidence is not None
    calm = stream_verdict(key, run(StreamState(), probes[:MIN]), DESIGNS, probes[:MIN])
    assert calm.blamed is None
    assert stream_verdict(key, StreamState(), None, []).evidence is None


def test_a_second_incident_is_blamed_on_what_serves_it_not_on_the_one_recovered_from() -> None:
    p = Probes()
    key = StreamKey("m", "production")
    first = p.many(MIN, kind="production", class_ref="a@r1") + p.many(4, diverged=True, kind="production",
                                                                     class_ref="long@r2", engine="l-0")
    recovered = run(StreamState(), first + p.many(RECOVERY, kind="production", class_ref="a@r1"))
    assert recovered.verdict == "healthy" and recovered.recovered_at_probe == MIN + 4 + RECOVERY
    # the second incident serves 3 bad probes from kv@r3; long@r2's 4 are still in the 50-probe window
    second = p.many(3, diverged=True, kind="production", class_ref="kv@r3", engine="k-0")
    state = run(recovered, second)
    window = [*first, *second]
    assert state.verdict == "drifting" and blame(window, 0.0) == "long@r2 l-0"  # the whole window's word
    assert stream_verdict(key, state, DESIGNS, window).blamed == "kv@r3 k-0"


def verdict(kind: str, class_ref: str | None, condition: int | None, v: str, blamed: str | None = None) -> StreamVerdict:
    return StreamVerdict(model="m", kind=kind, class_ref=class_ref, condition=condition, verdict=v, since=T0,  # type: ignore[arg-type]
                         blamed=blamed)


@pytest.mark.parametrize(("verdicts", "expected"), [
    ([verdict("pinned", "b@r2", 1, "healthy")], "pass"),
    ([verdict("pinned", "b@r2", 1, "healthy"), verdict("pinned", "b@r2", 4, "not_measured")], "pass"),
    ([verdict("pinned", "b@r2", 1, "healthy"), verdict("pinned", "b@r2", 8, "drifting")], "fail"),
    ([verdict("pinned", "b@r2", 1, "failing")], "fail"),
    ([verdict("pinned", "b@r2", 1, "not_measured")], None),  # never a pass for lack of data
    ([verdict("pinned", "b@r2", 4, "healthy")], None),  # only the batch-1 stream passes a class
    ([], None),
    ([verdict("pinned", "b@r2", 1, "healthy"), verdict("production", None, None, "drifting", "b@r2 e3")], "fail"),
    ([verdict("pinned", "b@r2", 1, "healthy"), verdict("production", None, None, "drifting", "a@r1")], "pass"),
    ([verdict("pinned", "b@r2", 1, "healthy"), verdict("pinned", "a@r1", 1, "drifting")], "pass"),
])
def test_class_quality(verdicts: list[StreamVerdict], expected: str | None) -> None:
    assert class_quality(verdicts, "b@r2") == expected
