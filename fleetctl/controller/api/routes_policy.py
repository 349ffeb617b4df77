"""Traffic policies (model -> {class_ref: weight}) and feature flags; both reach gateways via routing."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response

from fleetctl.controller import drills, flags, routing_generation, traffic, views
from fleetctl.controller.api.deps import Change, get_runtime, if_match, mutation, require, valid_name
from fleetctl.controller.audit import NOOP, OK
from fleetctl.controller.auth import OPERATOR, VIEWER
from fleetctl.controller.responses import FlagSetResult, FlagView, TrafficPolicyView, TrafficSetResult, TrafficView
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.schemas import FlagSet, TrafficSet
from fleetctl.controller.versions import etag

router = APIRouter(prefix="/api/v1", tags=["policy"])
read = [Depends(require(VIEWER))]


@router.get("/traffic", name="traffic.list", response_model=dict[str, TrafficPolicyView], dependencies=read)
def traffic_list(runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    with runtime.store.session() as session:
        return traffic.list_traffic(session)


@router.get("/traffic/{model}", name="traffic.show", response_model=TrafficView, dependencies=read)
def traffic_show(model: str, runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    """The model's weights and, per revision, its ready engines and correctness fields; `drill`: a misroute
    drill in effect, which gateways apply on top of the weights."""
    with runtime.store.session() as session:
        drill = drills.misroute_of(session, model)
        return {**traffic.traffic_view(session, model),
                "drill": drills.drill_view(drill, runtime.clock()) if drill is not None else None}


@router.put("/traffic/{model}", name="traffic.set", response_model=TrafficSetResult, responses={409: {"description": "refused by the split guard"}})
def traffic_set(model: str, body: TrafficSet, response: Response, change: Change = Depends(mutation(OPERATOR)),
                expected: int | None = Depends(if_match)) -> dict[str, Any]:
    """Refused (409 `correctness_split_refused`) when positively weighted revisions differ in correctness
    fields, unless `allow_correctness_change` (then stored and audited with code `correctness_change_allowed`);
    409 `no_ready_engines` when a positively weighted revision has no ready engine. `generation` is the
    routing table generation that includes this change: gateways at or past it have applied it. With
    `If-Match: "<version>"` only if the stored policy is at that version (409 `version_conflict`)."""
    runtime = change.runtime
    weights = dict(body.weights)
    with runtime.store.session() as session:
        outcome = traffic.set_traffic(session, model, weights, body.allow_correctness_change, change.actor, runtime.clock(),
                                      expected)
        change.record(session, target=model, result=OK if outcome.changed else NOOP,
                      code=outcome.audit_code, detail=outcome.audit_detail)
        generation, _table = routing_generation.stamp(session, lambda: views.routing_content(session))
    response.headers["ETag"] = etag(outcome.version)
    return {"model": model, "weights": weights, "result": "changed" if outcome.changed else "unchanged",
            "version": outcome.version,
            "generation": generation, "correctness_change_allowed": outcome.audit_detail is not None,
            "correctness_differences": [d.to_json() for d in outcome.allowed_differences]}


@router.get("/flags", name="flag.list", response_model=dict[str, FlagView], dependencies=read)
def flag_list(runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    with runtime.store.session() as session:
        return flags.list_flags(session)


@router.put("/flags/{name}", name="flag.set", response_model=FlagSetResult)
def flag_set(name: str, body: FlagSet, response: Response, change: Change = Depends(mutation(OPERATOR)),
             expected: int | None = Depends(if_match)) -> dict[str, Any]:
    """With `If-Match: "<version>"` only if the stored flag is at that version (409 `version_conflict`)."""
    runtime = change.runtime
    with runtime.store.session() as session:
        changed, version = flags.set_flag(session, valid_name(name), body.value, change.actor, runtime.clock(), expected)
        change.record(session, target=name, result=OK if changed else NOOP)
    response.headers["ETag"] = etag(version)
    return {"name": name, "value": body.value, "result": "changed" if changed else "unchanged", "version": version}
