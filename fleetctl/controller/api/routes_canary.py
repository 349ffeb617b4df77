"""The quality canary's verdicts: every stream's verdict with its evidence, one class revision's streams
and probe history, and the verdict changes (alerts and recoveries). Reads only, with a viewer token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query

from fleetctl.controller import canary_views
from fleetctl.controller.api.deps import get_runtime, require
from fleetctl.controller.auth import VIEWER
from fleetctl.controller.canary_streams import DesignSettings
from fleetctl.controller.canary_responses import CanaryClassView, CanaryEventView, CanaryStreamView
from fleetctl.controller.runtime import ControllerRuntime

router = APIRouter(prefix="/api/v1/canary", tags=["canary"])
read = [Depends(require(VIEWER))]
Model = Query(default=None, max_length=200, description="only this served model's streams")
Limit = Query(default=50, ge=1, le=canary_views.MAX_LIMIT, description="how many of the latest")


@router.get("/status", name="canary.status", response_model=list[CanaryStreamView], dependencies=read)
def canary_status(model: str | None = Model, runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    """Each stream's verdict (not_measured until it has enough probes: never healthy by default) and the
    evidence: the test statistics against their thresholds, the window's bad prompts, the first divergence."""
    with runtime.store.session() as session:
        return canary_views.status(session, DesignSettings.of(runtime.settings), model)


@router.get("/classes/{ref}", name="canary.class", response_model=CanaryClassView, dependencies=read)
def canary_class(ref: str, limit: int = Limit, runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    """A class revision (NAME@rN, or NAME for its latest): its streams and the latest probes it served."""
    with runtime.store.session() as session:
        return canary_views.class_view(session, DesignSettings.of(runtime.settings), ref, limit)


@router.get("/events", name="canary.events", response_model=list[CanaryEventView], dependencies=read)
def canary_events(model: str | None = Model, limit: int = Limit,
                  runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    """Verdict changes, oldest first: alerts (to drifting or failing), recoveries, and the rest."""
    with runtime.store.session() as session:
        return canary_views.events(session, model, limit)
