"""Golden sets and canary references in the store, and which reference a class revision is judged against.

`put_golden_set` stores a golden set once per (name, version): the same content again is a no-op, other content
under the same version a 409 naming `version` (a set is never changed; a new one is a new version).
`put_reference` stores a recorded reference after checking it against the store: its class revision exists
(404 `class_ref`), it was recorded from that revision's correctness fields (422 `correctness_digest`), its
golden set is stored and for the same model (422), and it answers every prompt of the set and no other (422
naming the prompt). `list_golden_sets` and `list_references` are the summaries the API lists (no bodies).

`reference_for(session, model, class_ref)` picks, newest first:
1. a reference recorded from that revision itself: compared exactly;
2. one recorded from a revision of the same model with the same correctness digest (a performance-only
   change, such as a bigger KV pool, must give the same tokens): compared exactly;
3. otherwise the model's newest reference (from a correctness-different class, e.g. a long-context build):
   compared with the golden set's tolerance.
None when the model has no reference at all: the class is not measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from engine.contract.bounds import INT32_MAX
from fleetctl.canary.golden import golden_digest
from fleetctl.canary.types import CompareMode, GoldenSet, Reference
from fleetctl.controller.models import CanaryReference, ClassRevision, GoldenSetRow
from fleetctl.errors import Conflict, NotFound, ValidationFailed
from fleetctl.replica_class import ReplicaClassSpec, correctness_digest

MODEL_MAX = 200  # the model columns' length


@dataclass(frozen=True)
class ChosenReference:
    id: int
    reference: Reference
    golden: GoldenSet
    mode: CompareMode


def reference_for(session: Session, model: str, class_ref: str) -> ChosenReference | None:
    rows = list(session.execute(select(CanaryReference).where(CanaryReference.model == model)
                                .order_by(CanaryReference.id.desc())).scalars())
    if not rows:
        return None
    chosen, mode = _choose(session, rows, class_ref)
    golden_row = session.get(GoldenSetRow, (chosen.golden_set, chosen.golden_version))
    if golden_row is None:  # put_reference stores the golden set first; a reference without one is unusable
        return None
    return ChosenReference(chosen.id, Reference.model_validate(chosen.body),
                           GoldenSet.model_validate(golden_row.body), mode)


def class_correctness_digest(session: Session, class_ref: str) -> str | None:
    row = session.get(ClassRevision, class_ref)
    return None if row is None else correctness_digest(ReplicaClassSpec.model_validate(row.spec))


def _choose(session: Session, rows: list[CanaryReference], class_ref: str) -> tuple[CanaryReference, CompareMode]:
    for row in rows:
        if row.class_ref == class_ref:
            return row, "exact"
    digest = class_correctness_digest(session, class_ref)
    for row in rows:
        if digest is not None and row.correctness_digest == digest:
            return row, "exact"
    return rows[0], "tolerance"


# --- storing and listing ----------------------------------------------------------------------------------------

def put_golden_set(session: Session, golden: GoldenSet, actor: str, now: datetime) -> bool:
    """True when stored, False when the identical set is already there."""
    _storable_version(golden.version, "version")
    if len(golden.model) > MODEL_MAX:
        raise ValidationFailed(f"model: longer than {MODEL_MAX} characters", field="model")
    digest = golden_digest(golden)
    row = session.get(GoldenSetRow, (golden.name, golden.version))
    if row is not None:
        if row.digest == digest:
            return False
        raise Conflict(f"version: golden set {golden.name!r} version {golden.version} is stored with other content; "
                       "a changed set needs a new version", code="golden_set_exists", field="version")
    session.add(GoldenSetRow(name=golden.name, version=golden.version, model=golden.model, digest=digest,
                             body=golden.model_dump(mode="json"), created_at=now, created_by=actor))
    session.flush()
    return True


def put_reference(session: Session, reference: Reference, actor: str, now: datetime) -> int:
    """The new reference's id. Stored only if it fits its class revision and its golden set. Who recorded it
    and when are the controller's: `actor` (the caller's token) and `now` (the recording ends with the upload)."""
    _storable_version(reference.golden_version, "golden_version")
    revision = session.get(ClassRevision, reference.class_ref)
    if revision is None:
        raise NotFound(f"class_ref: no class revision {reference.class_ref!r}", field="class_ref")
    spec = ReplicaClassSpec.model_validate(revision.spec)
    if spec.model != reference.model:
        raise ValidationFailed(f"model: {reference.class_ref} serves {spec.model!r}, the reference is for "
                               f"{reference.model!r}", field="model")
    if correctness_digest(spec) != reference.correctness_digest:
        raise ValidationFailed(f"correctness_digest: does not match {reference.class_ref}'s correctness fields",
                               field="correctness_digest")
    golden = _stored_golden(session, reference)
    _check_prompts(reference, golden)
    row = CanaryReference(model=reference.model, golden_set=reference.golden_set,
                          golden_version=reference.golden_version, class_ref=reference.class_ref,
                          correctness_digest=reference.correctness_digest,
                          body=reference.model_copy(update={"recorded_by": actor, "recorded_at": now}).model_dump(mode="json"),
                          recorded_at=now, recorded_by=actor)
    session.add(row)
    session.flush()
    return row.id


def list_golden_sets(session: Session) -> list[dict[str, Any]]:
    rows = session.execute(select(GoldenSetRow).order_by(GoldenSetRow.name, GoldenSetRow.version)).scalars()
    return [golden_summary(row) for row in rows]


def list_references(session: Session, model: str | None = None) -> list[dict[str, Any]]:
    """Oldest first; `model` filters. Summaries, not the bodies (token ids and logprobs of every prompt)."""
    query = select(CanaryReference).order_by(CanaryReference.id)
    if model is not None:
        query = query.where(CanaryReference.model == model)
    return [reference_summary(row) for row in session.execute(query).scalars()]


def golden_summary(row: GoldenSetRow) -> dict[str, Any]:
    body = row.body or {}
    return {"name": row.name, "version": row.version, "model": row.model, "digest": row.digest,
            "description": body.get("description", ""), "prompts": len(body.get("prompts") or []),
            "created_at": row.created_at.isoformat(), "created_by": row.created_by}


def reference_summary(row: CanaryReference) -> dict[str, Any]:
    """Per batch condition the recording's runs, diverged runs and largest distance, summed over the prompts;
    and how many expected answers the reference itself passed and failed."""
    reference = Reference.model_validate(row.body)
    noise: dict[int, dict[str, Any]] = {}
    for prompt in reference.prompts.values():
        for condition, seen in prompt.noise.items():
            total = noise.setdefault(condition, {"runs": 0, "diverged": 0, "max_distance": 0.0})
            total["runs"] += seen.runs
            total["diverged"] += seen.diverged
            total["max_distance"] = max(total["max_distance"], seen.max_distance)
    outcomes = [p.expected_pass for p in reference.prompts.values() if p.expected_pass is not None]
    return {"id": row.id, "model": row.model, "class_ref": row.class_ref, "golden_set": row.golden_set,
            "golden_version": row.golden_version, "correctness_digest": row.correctness_digest,
            "recorded_at": row.recorded_at.isoformat(), "recorded_by": row.recorded_by,
            "prompts": len(reference.prompts), "noise": dict(sorted(noise.items())),
            "expected_passed": sum(outcomes), "expected_failed": len(outcomes) - sum(outcomes)}


def _storable_version(version: int, field: str) -> None:
    if version > INT32_MAX:  # an Integer column
        raise ValidationFailed(f"{field}: must be at most {INT32_MAX}", field=field)


def _stored_golden(session: Session, reference: Reference) -> GoldenSet:
    row = session.get(GoldenSetRow, (reference.golden_set, reference.golden_version))
    if row is None:
        raise ValidationFailed(f"golden_set: golden set {reference.golden_set!r} version {reference.golden_version} "
                               "is not stored; upload it first", field="golden_set")
    if row.model != reference.model:
        raise ValidationFailed(f"model: golden set {reference.golden_set!r} is for {row.model!r}, the reference is "
                               f"for {reference.model!r}", field="model")
    return GoldenSet.model_validate(row.body)


def _check_prompts(reference: Reference, golden: GoldenSet) -> None:
    wanted = [prompt.id for prompt in golden.prompts]
    for prompt_id in wanted:
        if prompt_id not in reference.prompts:
            raise ValidationFailed(f"prompts.{prompt_id}: prompt {prompt_id!r} of golden set {golden.name!r} has no "
                                   "reference", field=f"prompts.{prompt_id}")
    for prompt_id, prompt in reference.prompts.items():
        if prompt_id not in wanted:
            raise ValidationFailed(f"prompts.{prompt_id}: prompt {prompt_id!r} is not in golden set {golden.name!r} "
                                   f"version {golden.version}", field=f"prompts.{prompt_id}")
        if prompt.prompt_id != prompt_id:
            raise ValidationFailed(f"prompts.{prompt_id}.prompt_id: is {prompt.prompt_id!r}",
                                   field=f"prompts.{prompt_id}.prompt_id")
