"""Deployments: set (create or update), list, show, delete."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response

from fleetctl.controller import deployments
from fleetctl.controller.api.deps import Change, get_runtime, if_match, mutation, require, valid_name
from fleetctl.controller.audit import NOOP, OK
from fleetctl.controller.auth import OPERATOR, VIEWER
from fleetctl.controller.responses import DeploymentDeleted, DeploymentSetResult, DeploymentView
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.schemas import Body, DeploymentSet
from fleetctl.controller.versions import etag

router = APIRouter(prefix="/api/v1/deployments", tags=["deployments"])
read = [Depends(require(VIEWER))]


@router.put("/{name}", name="deployment.set", response_model=DeploymentSetResult,
            responses={201: {"model": DeploymentSetResult, "description": "created"}})
def deployment_set(name: str, body: DeploymentSet, response: Response, change: Change = Depends(mutation(OPERATOR)),
                   expected: int | None = Depends(if_match)) -> dict[str, Any]:
    """Create or update. With `If-Match: "<version>"` only if the stored deployment is at that version (409
    `version_conflict` otherwise); two concurrent writers of one version: one applies, the other is a 409."""
    runtime = change.runtime
    with runtime.store.session() as session:
        row, result = deployments.set_deployment(session, valid_name(name), body, change.actor, runtime.clock(), expected)
        status = 201 if result == deployments.CREATED else 200
        change.record(session, target=name, result=NOOP if result == deployments.UNCHANGED else OK, status=status)
        view = deployments.deployment_view(row)
    response.status_code = status
    response.headers["ETag"] = etag(view["version"])
    runtime.wake()
    return {**view, "result": result}


@router.get("", name="deployment.list", response_model=list[DeploymentView], dependencies=read)
def deployment_list(runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    with runtime.store.session() as session:
        return [deployments.deployment_view(row) for row in deployments.list_deployments(session)]


@router.get("/{name}", name="deployment.show", response_model=DeploymentView, dependencies=read)
def deployment_show(name: str, response: Response, runtime: ControllerRuntime = Depends(get_runtime)) -> dict[str, Any]:
    with runtime.store.session() as session:
        view = deployments.deployment_view(deployments.get_deployment(session, name))
    response.headers["ETag"] = etag(view["version"])
    return view


@router.delete("/{name}", name="deployment.delete", response_model=DeploymentDeleted)
def deployment_delete(name: str, body: Body | None = None, change: Change = Depends(mutation(OPERATOR)),
                      expected: int | None = Depends(if_match)) -> dict[str, Any]:
    """The deployment's engines are drained by the next reconcile. With `If-Match`, only at that version."""
    runtime = change.runtime
    with runtime.store.session() as session:
        deployments.delete_deployment(session, name, expected)
        change.record(session, target=name)
    runtime.wake()
    return {"name": name, "result": "deleted"}
