"""Streams of probe scores -> verdicts. Pure: the verdict reconciler (controller/canary_verdicts.py) folds
each stream's new probes here and stores the state; the API builds the evidence from it.

Each stream runs two Bernoulli CUSUMs (cusum.py): the *divergence* test (bad: the answer differs from the
reference beyond the class's own noise) and, when some prompt's reference answer passed its expected check,
the *answer* test (bad: a correct answer turned wrong). The verdict:

- `failing` while the answer test's alarm is in force (answers are wrong);
- `drifting` while the divergence test's alarm is in force (answers differ beyond the noise);
- `not_measured` otherwise, until the stream has `min_probes` scored probes (failed probes, without a score,
  do not count): a stream that was never measured is never shown as healthy;
- `healthy` otherwise.

An alarm is not held back until `min_probes`: the CUSUM starts at 0, so its false-alarm rate (the ARL0 its
threshold is designed for) holds from the first probe, and a new revision that is plainly wrong is named as
soon as the evidence crosses the threshold. Only "healthy" needs the minimum.

After an alarm the statistic restarts at 0, but the alarm stays in force (the verdict holds) until
`recovery_probes` consecutive good probes; then the stream is healthy again. `since` is when the verdict
last changed (the time of the probe that changed it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from fleetctl.canary import cusum
from fleetctl.canary.types import (
    CusumDesign, CusumState, Evidence, ProbeRecord, StreamKey, StreamState, StreamVerdict, Verdict,
)

RECENT = 50  # probes kept as a stream's evidence window (ids and the statistic after each)
ALARMS: tuple[Verdict, ...] = ("drifting", "failing")
QUALITY_BATCH = 1  # the pinned stream whose health passes a class: its probes alone at the engine


@dataclass(frozen=True)
class StreamDesigns:
    divergence: CusumDesign
    answer: CusumDesign | None  # None: no prompt takes part in the answer test


@dataclass(frozen=True)
class VerdictChange:
    at: datetime
    verdict_from: Verdict
    verdict_to: Verdict
    probe_id: int | None  # the probe that changed it; None: not a probe (the class is no longer deployed)
    state: StreamState  # the stream right after the change: its evidence then


def fold(state: StreamState, probes: Sequence[ProbeRecord], designs: StreamDesigns, now: datetime, *,
         min_probes: int, recovery_probes: int) -> StreamState:
    """The stream after `probes` (folded in id order; ones at or below `last_probe_id` are skipped)."""
    return fold_changes(state, probes, designs, now, min_probes=min_probes, recovery_probes=recovery_probes)[0]


def fold_changes(state: StreamState, probes: Sequence[ProbeRecord], designs: StreamDesigns, now: datetime, *,
                 min_probes: int, recovery_probes: int) -> tuple[StreamState, list[VerdictChange]]:
    """`fold`, and every verdict change on the way (an alarm and a recovery in one batch are two)."""
    state = with_designs(state, designs)
    if state.since is None:
        state = state.model_copy(update={"since": now})
    changes: list[VerdictChange] = []
    for probe in sorted(probes, key=lambda p: p.id or 0):
        if probe.id is not None and probe.id <= state.last_probe_id:
            continue
        before = state.verdict
        state = _step(state, probe, designs, min_probes, recovery_probes)
        if state.verdict != before:
            changes.append(VerdictChange(probe.at, before, state.verdict, probe.id, state))
    return state, changes


def with_designs(state: StreamState, designs: StreamDesigns) -> StreamState:
    """The state on the designs' grids: a stream whose noise bound changed (a new reference) keeps its
    statistics in count units, re-expressed on the new grid."""
    divergence, answer = state.divergence, state.answer
    if state.p0 is not None and state.p0 != designs.divergence.p0:
        divergence = cusum.regrid(divergence, _former_grid(state.p0, designs.divergence), designs.divergence.m)
    if designs.answer is not None and state.answer_p0 is not None and state.answer_p0 != designs.answer.p0:
        answer = cusum.regrid(answer, _former_grid(state.answer_p0, designs.answer), designs.answer.m)
    return state.model_copy(update={
        "divergence": divergence, "answer": answer, "p0": designs.divergence.p0,
        "answer_p0": designs.answer.p0 if designs.answer is not None else None})


def _former_grid(former_p0: float, current: CusumDesign) -> int:
    """The grid the statistic was on: the design for the former p0 at the current design's shift."""
    shift = (current.p1 - current.p0) / (1 - current.p0)
    return cusum.grid(former_p0, cusum.shifted(former_p0, shift))


def _step(state: StreamState, probe: ProbeRecord, designs: StreamDesigns, min_probes: int,
          recovery_probes: int) -> StreamState:
    last = max(state.last_probe_id, probe.id or 0)
    score = probe.score
    if score is None:  # the probe failed: nothing to judge
        return state.model_copy(update={"last_probe_id": last})
    divergence = cusum.update(state.divergence, score.diverged, designs.divergence, probe.at)
    answer = state.answer
    if designs.answer is not None and score.answer_bad is not None:
        answer = cusum.update(answer, score.answer_bad, designs.answer, probe.at)
    bad = score.diverged or score.answer_bad is True
    clean_run = 0 if bad else state.clean_run + 1
    recovered_at_probe = state.recovered_at_probe
    if clean_run >= recovery_probes and (divergence.alarmed_at or answer.alarmed_at):
        divergence, answer = _cleared(divergence), _cleared(answer)
        recovered_at_probe = probe.id or recovered_at_probe
    verdict = _verdict(divergence, answer, min_probes)
    recent = [*state.recent, probe.id or 0][-RECENT:]
    trend = [*state.trend, cusum.statistic(divergence, designs.divergence)][-RECENT:]
    return state.model_copy(update={
        "divergence": divergence, "answer": answer, "verdict": verdict, "last_probe_id": last,
        "since": probe.at if verdict != state.verdict else state.since, "recent": recent, "trend": trend,
        "clean_run": clean_run, "recovered_at_probe": recovered_at_probe})


def _cleared(state: CusumState) -> CusumState:
    return state.model_copy(update={"alarmed_at": None})


def _verdict(divergence: CusumState, answer: CusumState, min_probes: int) -> Verdict:
    if answer.alarmed_at is not None:
        return "failing"
    if divergence.alarmed_at is not None:
        return "drifting"
    if divergence.probes < min_probes:
        return "not_measured"
    return "healthy"


def unmeasured(state: StreamState, now: datetime) -> StreamState:
    """A stream whose class revision is no longer deployed: a fresh start, not measured since `now` (a
    revision deployed again must earn its verdict again). The probe cursor is kept."""
    if state.verdict == "not_measured" and state.divergence.probes == 0:
        return state
    return StreamState(verdict="not_measured", since=now, last_probe_id=state.last_probe_id)


# --- evidence ------------------------------------------------------------------------------------------------

def is_bad(probe: ProbeRecord) -> bool:
    return probe.score is not None and (probe.score.diverged or probe.score.answer_bad is True)


def evidence(state: StreamState, designs: StreamDesigns, probes: Iterable[ProbeRecord]) -> Evidence:
    """The statistics against their thresholds, and what the window's bad probes were (`probes`: the
    stream's recent probes, as far as they are still stored)."""
    recent = set(state.recent)
    window = [p for p in probes if p.id is None or p.id in recent]
    bad = [p for p in window if is_bad(p)]
    divergences = [p.score.first_divergence for p in bad
                   if p.score is not None and p.score.diverged and p.score.first_divergence is not None]
    answer = designs.answer
    return Evidence(
        statistic=cusum.statistic(state.divergence, designs.divergence),
        threshold=cusum.threshold(designs.divergence),
        answer_statistic=cusum.statistic(state.answer, answer) if answer is not None else None,
        answer_threshold=cusum.threshold(answer) if answer is not None else None,
        probes=state.divergence.probes,
        bad=state.divergence.bad,
        bad_prompts=dict(Counter(p.prompt_id for p in bad)),
        first_divergence=min(divergences) if divergences else None,
        trend=list(state.trend),
        served_by=dict(Counter(_server(p) for p in bad)),
    )


def _server(probe: ProbeRecord) -> str:
    name = probe.class_ref or "?"
    return f"{name} {probe.engine}" if probe.engine else name


def blame(probes: Iterable[ProbeRecord], p0: float = 0.0) -> str | None:
    """The class revision serving the bad answers in a production window: the one with the most bad probes
    beyond its share of the noise (bad - p0 * served, so the class carrying most traffic is not blamed for
    the noise it carries), and 'class_ref engine' when one engine served most of that class's bad probes.
    None when no class has more bad probes than its noise explains."""
    scored = [p for p in probes if p.score is not None and p.class_ref]
    served = Counter(p.class_ref for p in scored)
    bad = [p for p in scored if is_bad(p)]
    excess = {ref: n - p0 * served[ref] for ref, n in Counter(p.class_ref for p in bad).items()}
    if not excess or max(excess.values()) <= 0:
        return None
    ref = max(sorted(excess), key=lambda r: excess[r])
    engines = Counter(p.engine for p in bad if p.class_ref == ref and p.engine)
    if engines:
        engine, count = max(sorted(engines.items()), key=lambda kv: kv[1])
        if count * 2 > sum(1 for p in bad if p.class_ref == ref):
            return f"{ref} {engine}"
    return ref


def blamed_class(blamed: str | None) -> str | None:
    """The class revision of a `blame` ('class_ref engine' -> class_ref)."""
    return blamed.split(" ", 1)[0] if blamed else None


def stream_verdict(key: StreamKey, state: StreamState, designs: StreamDesigns | None,
                   probes: Iterable[ProbeRecord]) -> StreamVerdict:
    """What the API serves of one stream. Without designs (no reference to judge it against) there is no
    evidence. While alarmed, a stream names what it blames: the production stream the class (and engine)
    serving the bad answers; a pinned stream the engine of its class, when one engine served most of them.
    The blame counts only the probes after the stream last recovered: the bad answers of an earlier incident
    (still in the window) name what served them then, not what serves them now."""
    window = list(probes)
    blamed = None
    if state.verdict in ALARMS:
        blamed = blame([p for p in window if p.id is None or p.id > state.recovered_at_probe], state.p0 or 0.0)
    return StreamVerdict(
        model=key.model, kind=key.kind, class_ref=key.class_ref, condition=key.condition, verdict=state.verdict,
        since=state.since, evidence=evidence(state, designs, window) if designs is not None else None,
        blamed=blamed)


# --- the rollout gate ----------------------------------------------------------------------------------------

def class_quality(verdicts: Iterable[StreamVerdict], class_ref: str) -> Literal["pass", "fail"] | None:
    """The canary's word on a class revision for the rollout gate. fail: one of its pinned streams is
    drifting or failing, or the stream of the production probes it served is, or the production stream
    alarmed blaming it. pass: its batch-1 pinned stream is healthy and nothing fails it. Otherwise None (not
    measured): never a pass for lack of data."""
    verdicts = list(verdicts)
    for v in verdicts:
        if v.verdict not in ALARMS:
            continue
        if v.kind == "pinned" and v.class_ref == class_ref:
            return "fail"
        if v.kind == "production" and class_ref in (v.class_ref, blamed_class(v.blamed)):
            return "fail"
    solo = [v for v in verdicts if v.kind == "pinned" and v.class_ref == class_ref and v.condition == QUALITY_BATCH]
    return "pass" if any(v.verdict == "healthy" for v in solo) else None
