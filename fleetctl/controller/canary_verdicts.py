"""The verdict reconciler: folds new canary probes into their streams' sequential tests and raises an alert
when a verdict changes (reconcile/protocol.py).

One run:
1. `snapshot`: every stored stream, the probes stored since the streams' cursor (in id order, at most
   MAX_PROBES_PER_RUN; a full batch asks for another run at once), the older probes still in the touched
   streams' evidence windows, the reference each new probe was scored against (for its noise, noise.py),
   and the class revisions each model has deployed;
2. `decide` (pure): each probe belongs to its pinned stream (model, 'pinned', class_ref, condition) and,
   when it took the production path, to its model's production stream too (pinned probes never enter the
   production stream, which must see what users see). A stream's designs follow from the largest noise
   bound among its new probes' references and the settings (canary_streams.designs_for); verdict.fold
   folds the probes. A stream whose class revision is no longer deployed (or, for the production stream,
   whose model has nothing deployed) is not measured, and starts afresh if it comes back;
3. `apply`: upserts the changed streams; for every verdict change, a canary_events row and an audit event
   (actor `controller`; action `canary.alert` when a stream turns drifting or failing, `canary.recovered`
   when it turns back to healthy, `canary.verdict` for the rest, such as not measured -> healthy; the stream
   and what the production stream blames in the reason); alerts and recoveries are also POSTed to
   settings.canary_webhook_url once the run has committed (canary_webhook.py: never blocking the run).

The gauges `fleet_canary_verdict{model,class,batch}` and `fleet_canary_statistic{model,class,batch}` are read
from the stored streams at each scrape (metrics.CanaryCollector).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from fleetctl.canary import noise
from fleetctl.canary.types import (GoldenSet, ProbeRecord, Reference, StreamKey, StreamState, StreamVerdict,
                                   condition_label, stream_name)
from fleetctl.canary.verdict import ALARMS, StreamDesigns, VerdictChange, fold_changes, stream_verdict, unmeasured
from fleetctl.controller import audit, canary_webhook
from fleetctl.controller.canary_streams import (
    DesignSettings, designs_for, load_streams, probe_record, probes_by_id, row_key,
)
from fleetctl.controller.models import CanaryEvent, CanaryProbe, CanaryReference, CanaryStream, Deployment, GoldenSetRow
from fleetctl.controller.reconcile.protocol import Result
from fleetctl.controller.rollouts import CONTROLLER
from fleetctl.controller.settings import ControllerSettings

log = logging.getLogger(__name__)

CANARY_VERDICTS = "canary_verdicts"
MAX_PROBES_PER_RUN = 2000
ALERT, RECOVERED, VERDICT = "canary.alert", "canary.recovered", "canary.verdict"

Post = Callable[[str, list[dict[str, Any]]], object]  # (url, payloads): canary_webhook.post_in_background


@dataclass(frozen=True)
class JudgedReference:
    """What the tests need of a reference: its recorded noise, and its golden set's floor."""

    reference: Reference
    p0_floor: float


@dataclass(frozen=True)
class VerdictSnapshot:
    streams: Mapping[StreamKey, StreamState]
    probes: tuple[ProbeRecord, ...]  # new, in id order
    window: Mapping[int, ProbeRecord]  # older probes still in the touched streams' evidence windows
    references: Mapping[int, JudgedReference]
    deployed: Mapping[str, frozenset[str]]  # model -> class revisions with replicas
    full: bool  # the batch hit MAX_PROBES_PER_RUN: more are waiting


@dataclass(frozen=True)
class Change:
    """A verdict change and the stream as it was right after it (the evidence its event records)."""

    change: VerdictChange
    view: StreamVerdict


@dataclass(frozen=True)
class StreamUpdate:
    key: StreamKey
    state: StreamState
    changes: tuple[Change, ...]


@dataclass(frozen=True)
class VerdictDecision:
    updates: tuple[StreamUpdate, ...]
    full: bool


@dataclass
class VerdictReport:
    streams: list[str] = field(default_factory=list)  # streams written
    events: list[str] = field(default_factory=list)  # '<stream>: <from> -> <to>'


@dataclass(frozen=True)
class FoldSettings:
    designs: DesignSettings
    min_probes: int
    recovery_probes: int

    @classmethod
    def of(cls, settings: ControllerSettings) -> "FoldSettings":
        return cls(DesignSettings.of(settings), settings.canary_min_probes, settings.canary_recovery_probes)


class CanaryVerdictReconciler:
    name = CANARY_VERDICTS

    def __init__(self, settings: ControllerSettings, post: Post = canary_webhook.post_in_background):
        self.interval_s = settings.reconcile_interval_s
        self.fold_settings = FoldSettings.of(settings)
        self.webhook_url = settings.canary_webhook_url
        self.post = post
        self._references: dict[int, JudgedReference] = {}  # references are never changed once stored

    def snapshot(self, session: Session, now: datetime) -> VerdictSnapshot:
        return load_snapshot(session, self._references)

    def decide(self, snapshot: VerdictSnapshot, now: datetime) -> VerdictDecision:
        return decide_verdicts(snapshot, self.fold_settings, now)

    def apply(self, session: Session, decision: VerdictDecision, now: datetime) -> Result[VerdictReport]:
        report, payloads = apply_verdicts(session, decision, now)
        if payloads and self.webhook_url:
            url, post = self.webhook_url, self.post
            # only what was committed is announced; the thread never holds up the run
            event.listen(session, "after_commit", lambda _s: post(url, payloads), once=True)
        return Result(report, changed=bool(report.streams), requeue_after=0.0 if decision.full else None)


# --- snapshot ------------------------------------------------------------------------------------------------

def load_snapshot(session: Session, cache: dict[int, JudgedReference] | None = None) -> VerdictSnapshot:
    streams = dict(load_streams(session))
    cursor = max((s.last_probe_id for s in streams.values()), default=0)
    rows = list(session.execute(select(CanaryProbe).where(CanaryProbe.id > cursor).order_by(CanaryProbe.id)
                                .limit(MAX_PROBES_PER_RUN + 1)).scalars())
    full = len(rows) > MAX_PROBES_PER_RUN
    probes = tuple(probe_record(r) for r in rows[:MAX_PROBES_PER_RUN])
    touched = {key for p in probes for key in streams_of(p)}
    window = probes_by_id(session, [i for key in touched if key in streams for i in streams[key].recent])
    ids = {p.reference_id for p in probes if p.reference_id is not None}
    return VerdictSnapshot(streams, probes, window, load_references(session, ids, cache if cache is not None else {}),
                           deployed_revisions(session), full)


def load_references(session: Session, ids: set[int], cache: dict[int, JudgedReference]) -> dict[int, JudgedReference]:
    if len(cache) > 256:  # bounded: a long-lived leader sees many re-recordings
        cache.clear()
    for ref_id in sorted(ids - cache.keys()):
        row = session.get(CanaryReference, ref_id)
        golden = session.get(GoldenSetRow, (row.golden_set, row.golden_version)) if row is not None else None
        if row is None or golden is None:  # pruned, or stored without its golden set: nothing to judge with
            continue
        cache[ref_id] = JudgedReference(Reference.model_validate(row.body), GoldenSet.model_validate(golden.body).p0_floor)
    return {i: cache[i] for i in ids if i in cache}


def deployed_revisions(session: Session) -> dict[str, frozenset[str]]:
    deployed: dict[str, set[str]] = defaultdict(set)
    for model, ref in session.execute(select(Deployment.model, Deployment.class_ref).where(Deployment.replicas > 0)):
        deployed[model].add(ref)
    return {model: frozenset(refs) for model, refs in deployed.items()}


# --- decide (pure) -------------------------------------------------------------------------------------------

def streams_of(probe: ProbeRecord) -> list[StreamKey]:
    """A pinned probe's stream: its class revision at its batch condition. A production-path probe's: its
    model's production stream (the mixture a user sees) and the stream of the production probes its serving
    revision answered (the attribution). The attribution is a stream of its own, not the revision's pinned
    one: a misrouted probe is held to the reference of the revision that should have served it, a pinned
    probe of a correctness-different revision only to the golden set's tolerance, and folded together the
    tolerant majority hid the exactly judged few (a misroute to a float16-KV class: its 3 misrouted answers
    all wrong, its 21 pinned ones within tolerance)."""
    if probe.kind != "production":
        return [StreamKey(probe.model, "pinned", probe.class_ref, probe.condition)] if probe.class_ref else []
    keys = [StreamKey(probe.model, "production")]
    if probe.class_ref:
        keys.append(StreamKey(probe.model, "production", probe.class_ref))
    return keys


def decide_verdicts(snapshot: VerdictSnapshot, settings: FoldSettings, now: datetime) -> VerdictDecision:
    new: dict[StreamKey, list[ProbeRecord]] = defaultdict(list)
    for probe in snapshot.probes:
        for key in streams_of(probe):
            new[key].append(probe)
    seen = {**snapshot.window, **{p.id: p for p in snapshot.probes if p.id is not None}}
    updates = []
    for key in sorted(set(snapshot.streams) | set(new), key=row_key):
        stored = snapshot.streams.get(key)
        before = stored or StreamState(since=now)
        state, changes, designs = judge(key, before, new.get(key, []), snapshot, settings, now)
        if stored is not None and state == stored:
            continue
        views = tuple(Change(c, stream_verdict(key, c.state, designs, [seen[i] for i in c.state.recent if i in seen]))
                      for c in changes)
        updates.append(StreamUpdate(key, state, views))
    return VerdictDecision(tuple(updates), snapshot.full)


def judge(key: StreamKey, state: StreamState, probes: Sequence[ProbeRecord], snapshot: VerdictSnapshot,
          settings: FoldSettings, now: datetime) -> tuple[StreamState, list[VerdictChange], StreamDesigns | None]:
    """One stream after its new probes, the verdict changes on the way, and its designs."""
    last = max([state.last_probe_id, *(p.id or 0 for p in probes)])
    if not is_deployed(key, snapshot.deployed):
        gone = unmeasured(state.model_copy(update={"last_probe_id": last}), now)
        changes = [VerdictChange(now, state.verdict, gone.verdict, None, gone)] if gone.verdict != state.verdict else []
        return gone, changes, None
    designs = stream_designs(key, state, probes, snapshot.references, settings.designs)
    if designs is None:  # no reference to judge by: the cursor moves on, nothing is judged
        return state.model_copy(update={"last_probe_id": last}), [], None
    folded, changes = fold_changes(state, probes, designs, now, min_probes=settings.min_probes,
                                   recovery_probes=settings.recovery_probes)
    return folded, changes, designs


def is_deployed(key: StreamKey, deployed: Mapping[str, frozenset[str]]) -> bool:
    revisions = deployed.get(key.model, frozenset())
    return bool(revisions) if key.class_ref is None else key.class_ref in revisions


def stream_designs(key: StreamKey, state: StreamState, probes: Sequence[ProbeRecord],
                   references: Mapping[int, JudgedReference], settings: DesignSettings) -> StreamDesigns | None:
    """The designs for the largest noise bound among the new probes' references (the safe side when a
    production stream mixes classes judged against different references); the stored bounds when none of
    them has a usable reference."""
    judged = [references[p.reference_id] for p in probes if p.reference_id in references]
    if not judged:
        return designs_for(key, state.p0, state.answer_p0, settings)
    p0 = max(noise.stream_p0(j.reference, key.condition, j.p0_floor) for j in judged)
    answers = [a for j in judged if (a := noise.answer_p0(j.reference, key.condition, j.p0_floor)) is not None]
    return designs_for(key, p0, max(answers) if answers else None, settings)


# --- apply ---------------------------------------------------------------------------------------------------

def apply_verdicts(session: Session, decision: VerdictDecision, now: datetime) -> tuple[VerdictReport, list[dict[str, Any]]]:
    """Upsert the streams and record their changes; returns the webhook payloads (alerts and recoveries)."""
    report, payloads = VerdictReport(), []
    for update in decision.updates:
        write_stream(session, update, now)
        report.streams.append(row_key(update.key))
        for change in update.changes:
            payload = record_change(session, update.key, change, now)
            report.events.append(f"{update.key.label()}: {change.change.verdict_from} -> {change.change.verdict_to}")
            if payload["event"] != VERDICT:
                payloads.append(payload)
    return report, payloads


def write_stream(session: Session, update: StreamUpdate, now: datetime) -> None:
    key, state = update.key, update.state
    row = session.get(CanaryStream, row_key(key))
    if row is None:
        row = CanaryStream(key=row_key(key), model=key.model, kind=key.kind, class_ref=key.class_ref,
                           condition=key.condition)
        session.add(row)
    row.verdict, row.since, row.state, row.updated_at = state.verdict, state.since, state.model_dump(mode="json"), now


def action_of(change: VerdictChange) -> str:
    if change.verdict_to in ALARMS:
        return ALERT
    if change.verdict_from in ALARMS and change.verdict_to == "healthy":
        return RECOVERED
    return VERDICT


def describe(key: StreamKey, change: VerdictChange, view: StreamVerdict) -> str:
    """One line: the stream, the change, and why (the statistic against its threshold, what is blamed)."""
    where = f"{key.model} {stream_name(key)}"
    text = f"{where}: {change.verdict_from} -> {change.verdict_to}"
    if change.probe_id is None and change.verdict_to == "not_measured":
        return f"{text} (no longer deployed)"
    ev = view.evidence
    if ev is not None:
        text += f" (divergence {ev.statistic:.2f}/{ev.threshold:.2f}"
        if ev.answer_statistic is not None and ev.answer_threshold is not None:
            text += f", answers {ev.answer_statistic:.2f}/{ev.answer_threshold:.2f}"
        text += f"; {ev.bad} bad of {ev.probes} probes)"
    if view.blamed:
        text += f"; blamed: {view.blamed}"
    return text


def record_change(session: Session, key: StreamKey, recorded: Change, now: datetime) -> dict[str, Any]:
    change, view = recorded.change, recorded.view
    message = describe(key, change, view)
    evidence = view.evidence.model_dump(mode="json") if view.evidence is not None else None
    row = CanaryEvent(at=change.at, model=key.model, kind=key.kind, class_ref=key.class_ref, condition=key.condition,
                      verdict_from=change.verdict_from, verdict_to=change.verdict_to, message=message, evidence=evidence)
    session.add(row)
    session.flush()
    payload = {"event": action_of(change), "id": row.id, "at": change.at.isoformat(), "model": key.model,
               "kind": key.kind, "class_ref": key.class_ref, "condition": key.condition,
               "batch": condition_label(key.condition), "verdict_from": change.verdict_from,
               "verdict_to": change.verdict_to, "blamed": view.blamed, "message": message, "evidence": evidence}
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    audit.record(session, audit.AuditRecord(
        actor=CONTROLLER, action=payload["event"], target=f"canary/{row_key(key)}", reason=message,
        payload_digest=digest, result=audit.OK, status=200), now)
    return payload
