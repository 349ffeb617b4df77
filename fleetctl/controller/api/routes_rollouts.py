"""Rollouts: start, list, show, operator commands (pause, resume, promote, abort, retry, undo), history.

Reads need a viewer token, everything else an operator's. Every mutation is audited with its reason; a
start that allowed a correctness change is audited with code `correctness_change_allowed` and the fields.
Commands take `If-Match: "<version>"` (409 `version_conflict` when the rollout moved on); without it a
command that meets a concurrent write by the reconciler re-reads and tries again. After a mutation the
reconcilers are woken, so the rollout acts on it at once.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Response
from pydantic import Field
from sqlalchemy.orm import Session

from fleetctl.controller import rollout_views, rollouts
from fleetctl.controller.api.deps import Change, get_runtime, if_match, mutation, require
from fleetctl.controller.auth import OPERATOR, VIEWER
from fleetctl.controller.rollout.view import RolloutEventView, RolloutView
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.schemas import Body
from fleetctl.controller.versions import etag

router = APIRouter(prefix="/api/v1/rollouts", tags=["rollouts"])
read = [Depends(require(VIEWER))]
RolloutId = Annotated[int, Path(ge=1, le=2**31 - 1, description="the rollout's id")]  # within the id column
Command = Literal["pause", "resume", "promote", "abort", "retry", "undo"]


class RolloutStart(Body):
    spec: dict[str, Any] = Field(description="the rollout spec (docs/rollouts.md), as YAML would hold it; "
                                             "validated whole: a 422 names the field, e.g. spec.steps.1.setWeight")


class RolloutCommand(Body):
    full: bool = Field(default=False, description="promote: skip every remaining step (all traffic to B now)")


REFUSALS = {409: {"description": "refused: another rollout of the model is active (`rollout_in_progress`), the quality "
                                 "gate is not measured (`quality_gate_unavailable`), the traffic is split "
                                 "(`traffic_split`), or the command does not apply to its state (e.g. `not_aborted`)"}}


@router.post("", name="rollout.start", response_model=RolloutView, status_code=201, responses=REFUSALS)
def rollout_start(body: RolloutStart, response: Response, change: Change = Depends(mutation(OPERATOR))) -> RolloutView:
    """Validate the spec and the revisions, then store the rollout (nothing is stored on a refusal)."""
    runtime = change.runtime
    with runtime.store.session() as session:
        now = runtime.clock()
        started = rollouts.start(session, body.spec, change.actor, now)
        change.record(session, target=f"rollouts/{started.row.id}", status=201, code=started.audit_code,
                      detail=started.audit_detail)
        view = rollout_views.rollout_view(session, started.row, now, runtime.started_at)
    response.headers["ETag"] = etag(view.version)
    runtime.wake()
    return view


@router.get("", name="rollout.list", response_model=list[RolloutView], dependencies=read)
def rollout_list(model: str | None = Query(default=None, max_length=200), active: bool | None = None,
                 runtime: ControllerRuntime = Depends(get_runtime)) -> list[RolloutView]:
    """Oldest first; `model` and `active` (not terminal) filter."""
    with runtime.store.session() as session:
        now = runtime.clock()
        return [rollout_views.rollout_view(session, row, now, runtime.started_at)
                for row in rollouts.list_rollouts(session, model, active)]


@router.get("/{rollout_id}", name="rollout.show", response_model=RolloutView, dependencies=read)
def rollout_show(rollout_id: RolloutId, response: Response, runtime: ControllerRuntime = Depends(get_runtime)) -> RolloutView:
    with runtime.store.session() as session:
        view = rollout_views.rollout_view(session, rollouts.get_rollout(session, rollout_id), runtime.clock(),
                                          runtime.started_at)
    response.headers["ETag"] = etag(view.version)
    return view


@router.get("/{rollout_id}/history", name="rollout.history", response_model=list[RolloutEventView], dependencies=read)
def rollout_history(rollout_id: RolloutId, runtime: ControllerRuntime = Depends(get_runtime)) -> list[RolloutEventView]:
    with runtime.store.session() as session:
        return [rollout_views.event_view(row) for row in rollouts.history(session, rollout_id)]


@router.post("/{rollout_id}/{command}", name="rollout.command", response_model=RolloutView,
             responses={**REFUSALS, 201: {"model": RolloutView, "description": "undo: the new rollout"}})
def rollout_command(rollout_id: RolloutId, command: Command, response: Response, body: RolloutCommand | None = None,
                    change: Change = Depends(mutation(OPERATOR)), expected: int | None = Depends(if_match)) -> RolloutView:
    """pause | resume | promote (`full`) | abort | retry: the rollout after the command. undo (of a
    completed or aborted rollout): a new rollout back to its `from` revision with the same steps (201)."""
    runtime = change.runtime
    full = body.full if body is not None else False

    def attempt(session: Session) -> RolloutView:
        now = runtime.clock()
        if command == rollouts.UNDO:
            started = rollouts.undo(session, rollout_id, change.actor, now)
            row = started.row
            change.record(session, target=f"rollouts/{rollout_id}", status=201, code=started.audit_code,
                          detail=started.audit_detail)
        else:
            row = rollouts.command(session, rollout_id, command, change.actor, now, full=full, reason=change.reason,
                                   expected_version=expected)
            change.record(session, target=f"rollouts/{rollout_id}")
        session.flush()
        return rollout_views.rollout_view(session, row, now, runtime.started_at)

    view = rollouts.with_retries(runtime.store, attempt)
    response.status_code = 201 if command == rollouts.UNDO else 200
    response.headers["ETag"] = etag(view.version)
    runtime.wake()
    return view
