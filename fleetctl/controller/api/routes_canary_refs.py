"""The quality canary's golden sets and references: upload and list.

POST /api/v1/canary/golden-sets takes a golden set as its file would hold it, validated whole (a 422 names the
entry and field, as the CLI's offline check does); the same set again is `unchanged`, other content under a
stored version a 409 naming `version`. POST /api/v1/canary/references takes a recorded reference
(canary.types.Reference), checked against its class revision and its stored golden set (canary_refs.put_reference).
Both need an operator's token and are audited; the lists need a viewer's and hold summaries, not the bodies.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query
from pydantic import Field

from fleetctl.canary.golden import parse_golden
from fleetctl.canary.types import Reference
from fleetctl.controller import canary_refs
from fleetctl.controller.api.deps import Change, get_runtime, mutation, require
from fleetctl.controller.audit import NOOP, OK
from fleetctl.controller.auth import OPERATOR, VIEWER
from fleetctl.controller.models import CanaryReference, GoldenSetRow
from fleetctl.controller.canary_ref_responses import GoldenSetStored, GoldenSetSummary, ReferenceSummary
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.schemas import Body

router = APIRouter(prefix="/api/v1/canary", tags=["canary-refs"])
read = [Depends(require(VIEWER))]


class GoldenSetUpload(Body):
    golden_set: dict[str, Any] = Field(description="the golden set as its YAML file holds it (name, version, model, "
                                       "prompts, ...); validated whole, a 422 names the entry and field")


class ReferenceUpload(Body):
    reference: Reference = Field(description="a reference recorded from a class revision (fleetctl canary record)")


@router.post("/golden-sets", name="canary.golden_set.put", response_model=GoldenSetStored,
             responses={409: {"description": "this name and version are stored with other content (`golden_set_exists`)"}})
def golden_set_put(body: GoldenSetUpload, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    runtime = change.runtime
    golden = parse_golden(body.golden_set, source=str(body.golden_set.get("name") or "(unnamed)"))
    with runtime.store.session() as session:
        created = canary_refs.put_golden_set(session, golden, change.actor, runtime.clock())
        change.record(session, target=f"golden-sets/{golden.name}/v{golden.version}", result=OK if created else NOOP)
        row = session.get(GoldenSetRow, (golden.name, golden.version))
        assert row is not None  # just stored, or already there
        return {**canary_refs.golden_summary(row), "result": "changed" if created else "unchanged"}


@router.get("/golden-sets", name="canary.golden_set.list", response_model=list[GoldenSetSummary], dependencies=read)
def golden_set_list(runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    """By name, then version."""
    with runtime.store.session() as session:
        return canary_refs.list_golden_sets(session)


@router.post("/references", name="canary.reference.put", response_model=ReferenceSummary, status_code=201,
             responses={404: {"description": "the class revision (`class_ref`) does not exist"}})
def reference_put(body: ReferenceUpload, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """Stored as the class revision's newest reference; nothing is stored on a refusal."""
    runtime = change.runtime
    with runtime.store.session() as session:
        reference_id = canary_refs.put_reference(session, body.reference, change.actor, runtime.clock())
        change.record(session, target=f"references/{reference_id}", status=201)
        row = session.get(CanaryReference, reference_id)
        assert row is not None
        return canary_refs.reference_summary(row)


@router.get("/references", name="canary.reference.list", response_model=list[ReferenceSummary], dependencies=read)
def reference_list(model: str | None = Query(default=None, max_length=200),
                   runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    """Oldest first; `model` filters."""
    with runtime.store.session() as session:
        return canary_refs.list_references(session, model)
