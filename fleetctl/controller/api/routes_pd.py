"""P:D: a model's ratio and engines, the planner's recommendation, and rebalances (preview, start, list, show,
stop).

Reads need a viewer token; a rebalance (start, stop) an operator's. A start is audited with its reason; the
reconciler is woken so the rebalance begins at once. The preview (`apply: false`) stores nothing.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from fleetctl.controller import pd_settings, pd_views, rebalances
from fleetctl.controller.api.deps import Change, get_runtime, mutation, require
from fleetctl.controller.auth import OPERATOR, VIEWER
from fleetctl.controller.pd_responses import (
    PdModelView, PdProfileSet, PdProfileView, PdSettingsSet, RebalanceStart, RebalanceStarted, RebalanceView,
)
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.schemas import Body

router = APIRouter(prefix="/api/v1/pd", tags=["pd"])
read = [Depends(require(VIEWER))]
RebalanceId = Annotated[int, Path(ge=1, le=2**31 - 1, description="the rebalance's id")]
ModelName = Annotated[str, Path(min_length=1, max_length=200)]


REFUSALS = {409: {"description": "refused: the fleet is frozen (`frozen`), a rollout of the model runs "
                                 "(`rollout_in_progress`), another rebalance runs (`rebalance_in_progress`), or the "
                                 "model runs several class revisions (`several_revisions`)"}}


@router.get("/models", name="pd.status", response_model=list[PdModelView], dependencies=read,
            responses={404: {"description": "the named model has no deployment (`model`)"}})
def pd_status(model: str | None = Query(default=None, max_length=200),
              runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    """Every model with deployments (or the one named): its ratio, engines, the planner's recommendation
    and the rebalance under way."""
    with runtime.store.session() as session:
        return pd_views.models_view(session, runtime.clock(), runtime.pd_memory, model)


@router.post("/models/{model}/rebalance", name="pd.rebalance", response_model=RebalanceStarted, responses=REFUSALS)
def pd_rebalance(model: ModelName, body: RebalanceStart,
                 change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """The preview; with `apply`, also the stored rebalance (a target equal to the current ratio stores
    nothing)."""
    runtime = change.runtime
    with runtime.store.session() as session:
        now = runtime.clock()
        planner = pd_settings.settings_for(session, model).planner
        target = rebalances.Target(body.prefill, body.decode, body.mixed, body.floor_prefill or planner.floor_prefill,
                                   body.floor_decode or planner.floor_decode)
        preview = rebalances.preview_view(session, model, target)
        if not body.apply or not preview["changes"]:
            return {"preview": preview, "rebalance": None}
        slo = {"ttft_slo_s": body.ttft_slo_s or planner.ttft_slo_s, "itl_slo_s": body.itl_slo_s or planner.itl_slo_s,
               "baseline_s": body.baseline_s}
        row = rebalances.start(session, model, target, slo, change.reason, change.actor, now)
        change.record(session, target=f"rebalances/{row.id}", status=200)
        view = rebalances.rebalance_view(session, row)
    runtime.wake()
    return {"preview": preview, "rebalance": view}


@router.get("/rebalances", name="pd.rebalance_list", response_model=list[RebalanceView], dependencies=read)
def rebalance_list(model: str | None = Query(default=None, max_length=200),
                   runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    """Newest first (the latest 50)."""
    with runtime.store.session() as session:
        return [rebalances.rebalance_view(session, row, with_events=False)
                for row in rebalances.list_rows(session, model)]


@router.get("/rebalances/{rebalance_id}", name="pd.rebalance_show", response_model=RebalanceView, dependencies=read)
def rebalance_show(rebalance_id: RebalanceId, runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    with runtime.store.session() as session:
        return rebalances.rebalance_view(session, rebalances.get(session, rebalance_id))


@router.post("/rebalances/{rebalance_id}/stop", name="pd.rebalance_stop", response_model=RebalanceView,
             responses={409: {"description": "the rebalance is already done (`rebalance_done`)"}})
def rebalance_stop(rebalance_id: RebalanceId, body: Body | None = None,
                   change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """Stop after the flip in progress, so the ratio stays whole."""
    runtime = change.runtime
    with runtime.store.session() as session:
        row = rebalances.request_stop(session, rebalance_id, change.actor, runtime.clock())
        change.record(session, target=f"rebalances/{rebalance_id}")
        view = rebalances.rebalance_view(session, row)
    runtime.wake()
    return view


@router.put("/models/{model}/settings", name="pd.settings", response_model=PdModelView)
def pd_set_settings(model: ModelName, body: PdSettingsSet, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """Set the planner's mode, floors, SLOs or headroom for a model (the fields given; the others stay)."""
    runtime = change.runtime
    changes = body.model_dump(exclude={"reason"}, exclude_none=True)
    with runtime.store.session() as session:
        pd_views.models_view(session, runtime.clock(), runtime.pd_memory, model)  # 404 for an unknown model
        pd_settings.set_settings(session, model, changes, change.actor, runtime.clock())
        change.record(session, target=f"pd/{model}")
        view = pd_views.models_view(session, runtime.clock(), runtime.pd_memory, model)[0]
    runtime.wake()
    return view


@router.put("/profiles/{class_ref}", name="pd.profile_set", response_model=PdProfileView)
def pd_profile_set(class_ref: Annotated[str, Path(min_length=1, max_length=80)], body: PdProfileSet,
                   change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """Store what one engine of the class revision does (`fleetctl pd profile` measures it)."""
    runtime = change.runtime
    with runtime.store.session() as session:
        row = pd_settings.store_profile(session, class_ref, body.prefill_tokens_per_s, body.decode_slots,
                                        body.decode_itl_s, body.detail, change.actor, runtime.clock())
        change.record(session, target=f"pd/profiles/{class_ref}")
        return pd_settings.profile_view(row)


@router.get("/profiles", name="pd.profile_list", response_model=list[PdProfileView], dependencies=read)
def pd_profile_list(runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    with runtime.store.session() as session:
        return [pd_settings.profile_view(row) for row in pd_settings.list_profiles(session)]
