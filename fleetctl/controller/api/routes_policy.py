"""Traffic policies (model -> {class_ref: weight}) and feature flags; both reach gateways via routing."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response

from fleetctl.controller import drills, flags, routing_generation, traffic, views
from fleetctl.controller.api import flag_writes
from fleetctl.controller.api.deps import Change, get_runtime, if_match, mutation, require
from fleetctl.controller.audit import NOOP, OK
from fleetctl.controller.auth import OPERATOR, VIEWER
from fleetctl.controller.responses import FlagSetResult, FlagView, TrafficPolicyView, TrafficSetResult, TrafficView
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.schemas import Body, FlagSet, TrafficSet
from fleetctl.controller.models import FeatureFlag
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
    """Every catalog flag by key: fleet-wide ones always, per-model ones (`NAME:MODEL`) where overridden."""
    with runtime.store.session() as session:
        return flags.list_flags(session, runtime.clock())


@router.get("/flags/{key}", name="flag.show", response_model=FlagView, dependencies=read)
def flag_show(key: str, runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    """One flag (`NAME` or `NAME:MODEL`), overridden or not; 422 naming `name` when the catalog has none."""
    spec, model = flag_writes.parse(key)
    with runtime.store.session() as session:
        return flags.flag_view(key, spec, model, session.get(FeatureFlag, key), runtime.clock())


@router.put("/flags/{key}", name="flag.set", response_model=FlagSetResult)
def flag_set(key: str, body: FlagSet, response: Response, change: Change = Depends(mutation(OPERATOR)),
             expected: int | None = Depends(if_match)) -> dict[str, Any]:
    """Override a catalog flag; `reason` required; `ttl_s`: it reverts to its default that long from now.
    A value not of the flag's type is a 422 naming `value`; a break-glass flag (freeze, pin) needs an admin
    token (403). `generation` is the routing generation that includes the change. With
    `If-Match: "<version>"` only if the override is at that version (409)."""
    spec, _model = flag_writes.parse(key)
    flag_writes.require_admin_for(change, spec)
    flag_writes.require_reason(change, "a flag override")
    result = flag_writes.write_override(change, key, body.value, body.ttl_s, expected)
    response.headers["ETag"] = etag(result["version"])
    return result


@router.delete("/flags/{key}", name="flag.unset", response_model=FlagSetResult)
def flag_unset(key: str, body: Body | None = None, change: Change = Depends(mutation(OPERATOR)),
               expected: int | None = Depends(if_match)) -> dict[str, Any]:
    """Remove the override: the flag has its default again (`unchanged` when there was none)."""
    spec, _model = flag_writes.parse(key)
    flag_writes.require_admin_for(change, spec)
    return flag_writes.remove_override(change, key, expected)
