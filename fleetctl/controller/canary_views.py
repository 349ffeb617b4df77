"""What the canary API serves (canary_responses.Canary*View shapes), read from the store: every stream's verdict
with its evidence, one class revision's streams and probe history, and the verdict changes (events)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.canary.types import ProbeRecord, StreamVerdict, condition_label
from fleetctl.controller import classes
from fleetctl.controller.canary_streams import DesignSettings, probe_record, stream_verdicts
from fleetctl.controller.models import CanaryEvent, CanaryProbe

MAX_LIMIT = 1000


def stream_view(v: StreamVerdict) -> dict[str, Any]:
    return {"model": v.model, "kind": v.kind, "class_ref": v.class_ref, "condition": v.condition,
            "batch": condition_label(v.condition), "verdict": v.verdict,
            "since": v.since.isoformat() if v.since else None, "blamed": v.blamed,
            "evidence": v.evidence.model_dump(mode="json") if v.evidence is not None else None}


def probe_view(p: ProbeRecord) -> dict[str, Any]:
    return {"id": p.id, "at": p.at.isoformat(), "model": p.model, "kind": p.kind, "class_ref": p.class_ref,
            "engine": p.engine, "condition": p.condition, "batch_size": p.batch_size, "prompt_id": p.prompt_id,
            "reference_id": p.reference_id, "score": p.score.model_dump(mode="json") if p.score else None,
            "error": p.error}


def status(session: Session, settings: DesignSettings, model: str | None) -> list[dict[str, Any]]:
    """Every stream (of `model`), production first per model, then by class revision and batch."""
    return [stream_view(v) for v in stream_verdicts(session, settings, model)]


def class_view(session: Session, settings: DesignSettings, ref: str, limit: int) -> dict[str, Any]:
    """A class revision (NAME@rN, or NAME for its latest) with its streams and the last `limit` probes it
    served, oldest first. 404 for an unknown class."""
    revision = classes.get_class(session, ref)
    rows = session.execute(select(CanaryProbe).where(CanaryProbe.class_ref == revision.ref)
                           .order_by(CanaryProbe.id.desc()).limit(min(limit, MAX_LIMIT))).scalars()
    probes = [probe_view(probe_record(r)) for r in rows][::-1]
    streams = [stream_view(v) for v in stream_verdicts(session, settings, class_ref=revision.ref)]
    return {"class_ref": revision.ref, "streams": streams, "probes": probes}


def events(session: Session, model: str | None, limit: int) -> list[dict[str, Any]]:
    """The latest `limit` verdict changes (of `model`), oldest first."""
    query = select(CanaryEvent)
    if model is not None:
        query = query.where(CanaryEvent.model == model)
    rows = list(session.execute(query.order_by(CanaryEvent.id.desc()).limit(min(limit, MAX_LIMIT))).scalars())
    return [{"id": r.id, "at": r.at.isoformat(), "model": r.model, "kind": r.kind, "class_ref": r.class_ref,
             "condition": r.condition, "batch": condition_label(r.condition), "verdict_from": r.verdict_from,
             "verdict_to": r.verdict_to, "message": r.message, "evidence": r.evidence} for r in rows[::-1]]
