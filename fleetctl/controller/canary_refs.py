"""Golden sets and canary references in the store, and which reference a class revision is judged against.

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

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.canary.types import CompareMode, GoldenSet, Reference
from fleetctl.controller.models import CanaryReference, ClassRevision, GoldenSetRow
from fleetctl.replica_class import ReplicaClassSpec, correctness_digest


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
