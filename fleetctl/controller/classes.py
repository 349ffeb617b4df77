"""Replica class revisions: immutable, content-addressed (ReplicaClassSpec.digest()), named NAME@rN.

Applying content identical to an existing revision of the name is a no-op that returns that revision;
changed content becomes the next revision.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fleetctl.controller.models import ClassRevision
from fleetctl.errors import NotFound, ValidationFailed
from fleetctl.replica_class import REF_PATTERN, ReplicaClassSpec, diff, format_ref, parse_ref


def apply_class(session: Session, name: str, spec: ReplicaClassSpec, actor: str, now: datetime) -> tuple[ClassRevision, bool]:
    """(revision, created). A concurrent apply of the same name fails on the unique constraint (409)."""
    digest = spec.digest()
    existing = session.execute(
        select(ClassRevision).where(ClassRevision.name == name, ClassRevision.digest == digest)
    ).scalar_one_or_none()
    if existing is not None:
        return existing, False
    latest = session.execute(select(func.max(ClassRevision.revision)).where(ClassRevision.name == name)).scalar()
    revision = (latest or 0) + 1
    row = ClassRevision(
        ref=format_ref(name, revision), name=name, revision=revision, digest=digest,
        spec=spec.model_dump(mode="json"), created_at=now, created_by=actor,
    )
    session.add(row)
    session.flush()
    return row, True


def get_class(session: Session, ref: str) -> ClassRevision:
    """By NAME@rN, or by NAME (its latest revision)."""
    if REF_PATTERN.match(ref):
        row = session.get(ClassRevision, ref)
    else:
        row = session.execute(
            select(ClassRevision).where(ClassRevision.name == ref).order_by(ClassRevision.revision.desc()).limit(1)
        ).scalar_one_or_none()
    if row is None:
        raise NotFound(f"no replica class {ref!r}", field="class")
    return row


def resolve_ref(session: Session, ref: str, field: str = "class_ref") -> ClassRevision:
    """Like get_class, but an unknown class is invalid input (422 naming `field`), not a missing resource."""
    if "@" in ref:
        try:
            parse_ref(ref)
        except ValueError as exc:
            raise ValidationFailed(f"{field}: {exc}", field=field) from None
    try:
        return get_class(session, ref)
    except NotFound:
        raise ValidationFailed(f"{field}: unknown replica class {ref!r}", field=field, code="unknown_class") from None


def list_classes(session: Session) -> list[dict[str, Any]]:
    rows = session.execute(select(ClassRevision).order_by(ClassRevision.name, ClassRevision.revision)).scalars()
    latest: dict[str, ClassRevision] = {}
    counts: dict[str, int] = {}
    for row in rows:
        latest[row.name] = row
        counts[row.name] = counts.get(row.name, 0) + 1
    return [
        {"name": name, "latest": row.ref, "revisions": counts[name], "model": row.spec.get("model"),
         "backend": row.spec.get("backend"), "created_at": row.created_at.isoformat()}
        for name, row in latest.items()
    ]


def class_history(session: Session, name: str) -> list[dict[str, Any]]:
    """Every revision, oldest first, each with the diff from the one before (correctness fields first)."""
    rows = list(session.execute(
        select(ClassRevision).where(ClassRevision.name == name).order_by(ClassRevision.revision)
    ).scalars())
    if not rows:
        raise NotFound(f"no replica class {name!r}", field="class")
    history, previous = [], None
    for row in rows:
        spec = ReplicaClassSpec.model_validate(row.spec)
        entry = revision_view(row)
        entry["changes"] = diff(previous, spec) if previous is not None else []
        history.append(entry)
        previous = spec
    return history


def revision_view(row: ClassRevision) -> dict[str, Any]:
    return {
        "name": row.name, "revision": row.revision, "ref": row.ref, "digest": row.digest, "spec": row.spec,
        "created_at": row.created_at.isoformat(), "created_by": row.created_by,
    }
