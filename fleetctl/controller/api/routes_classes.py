"""Replica classes: apply (create the next revision, or a no-op for identical content), get, list, history."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response

from fleetctl.controller import classes
from fleetctl.controller.api.deps import Change, get_runtime, mutation, require
from fleetctl.controller.audit import NOOP, OK
from fleetctl.controller.auth import OPERATOR, VIEWER
from fleetctl.controller.responses import ClassApplied, ClassHistoryEntry, ClassRevisionView, ClassSummary
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.schemas import ClassApply

router = APIRouter(prefix="/api/v1/classes", tags=["classes"])
read = [Depends(require(VIEWER))]


@router.post("", name="class.apply", status_code=201, response_model=ClassApplied,
             responses={200: {"model": ClassApplied, "description": "identical content: the existing revision"}})
def class_apply(body: ClassApply, response: Response, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    runtime = change.runtime
    with runtime.store.session() as session:
        revision, created = classes.apply_class(session, body.name, body.spec, change.actor, runtime.clock())
        status = 201 if created else 200
        change.record(session, target=revision.ref, result=OK if created else NOOP, status=status)
    response.status_code = status
    return {**classes.revision_view(revision), "result": "created" if created else "unchanged"}


@router.get("", name="class.list", response_model=list[ClassSummary], dependencies=read)
def class_list(runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    with runtime.store.session() as session:
        return classes.list_classes(session)


@router.get("/{ref}", name="class.get", response_model=ClassRevisionView, dependencies=read)
def class_get(ref: str, runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    """NAME@rN, or NAME for the latest revision."""
    with runtime.store.session() as session:
        return classes.revision_view(classes.get_class(session, ref))


@router.get("/{name}/history", name="class.history", response_model=list[ClassHistoryEntry], dependencies=read)
def class_history(name: str, runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    """Every revision, each with `changes` from the one before: [{field, tag, old, new}], correctness first."""
    with runtime.store.session() as session:
        return classes.class_history(session, name)
