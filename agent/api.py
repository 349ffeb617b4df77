"""The agent's small local API: what runs here, and break-glass actions that need no controller.

    GET  /health                     the agent is up; how its link to the controller stands
    GET  /engines                    observed state of every engine (the heartbeat's `engines`)
    POST /engines/{name}/drain       break-glass: stop taking requests, finish, exit
    POST /engines/{name}/restart     break-glass: restart the process (lifts a drain/stop hold)
    POST /engines/{name}/stop        break-glass: SIGTERM now (the engine drains within its grace)
    GET  /direct                     break-glass: the direct-action journal and the holds in force
    POST /direct/rotate              break-glass: a new credential (the old one stops working at once)

Break-glass calls need `Authorization: Bearer <credential>`: this node's break-glass credential (the admin
token file), compared in constant time. A body `{"reason": ...}` or an X-Fleet-Reason header says why. Each
action is written to the direct-action journal (fsynced) before it is done, and uploaded to the controller
when it is reachable. A drained or stopped engine stays down, whatever the controller assigns, until the
operator adopts or reverts the action (`fleetctl breakglass reconcile`) or restarts it here. Errors have the
controller's shape {"error": {"code", "message", "field"}}.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from engine.contract.direct import bearer_problem, new_credential, write_atomically

if TYPE_CHECKING:
    from agent.runtime import Agent

log = logging.getLogger("fleetctl.agent.api")

BREAK_GLASS_ACTIONS = ("drain", "restart", "stop")
BAD_CREDENTIAL = "bad_credential"  # not the controller's "unauthorized": the fix is the node's credential file


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


def make_api(agent: "Agent") -> FastAPI:
    app = FastAPI(title="fleetctl agent", summary="local observed state and break-glass actions")

    @app.exception_handler(ApiError)
    async def _render(_: Request, exc: ApiError) -> JSONResponse:
        body = {"error": {"code": exc.code, "message": exc.message, "field": exc.field}}
        return JSONResponse(body, status_code=exc.status)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "node": agent.settings.node, "controller": agent.link_status()}

    @app.get("/engines")
    async def engines() -> dict[str, Any]:
        observed = [engine.model_dump(mode="json") for engine in agent.supervisor.observed()]
        return {"node": agent.settings.node, "generation": agent.link_status()["generation"], "engines": observed}

    @app.post("/engines/{name}/{action}", status_code=202)
    async def break_glass(name: str, action: str, request: Request) -> dict[str, Any]:
        _authorize(request, agent.credential)
        if action not in BREAK_GLASS_ACTIONS:
            raise ApiError(404, "not_found", f"unknown action {action!r}; one of {', '.join(BREAK_GLASS_ACTIONS)}", "action")
        if name not in agent.supervisor.slots:
            raise ApiError(404, "not_found", f"no engine {name!r} on node {agent.settings.node}", "name")
        client = request.client.host if request.client else "?"
        reason = await _reason(request)
        log.warning("break-glass: %s %s requested from %s", action, name, client)
        entry = agent.break_glass(name, action, reason=reason, client=client)  # type: ignore[arg-type]
        return {"engine": name, "action": action, "accepted": True, "node": agent.settings.node, "seq": entry.seq}

    @app.get("/direct")
    async def direct(request: Request) -> dict[str, Any]:
        _authorize(request, agent.credential)
        return {"node": agent.settings.node, "uploaded": agent.journal.uploaded(),
                "holds": dict(agent.supervisor.held),
                "actions": [e.model_dump(mode="json") for e in agent.journal.entries()]}

    @app.post("/direct/rotate")
    async def rotate(request: Request) -> dict[str, Any]:
        _authorize(request, agent.credential)
        credential = new_credential()
        if agent.settings.admin_token_file is not None:  # written first: a crash leaves the new one on disk
            write_atomically(agent.settings.admin_token_file, credential + "\n", mode=0o600)
        agent.credential = credential
        log.warning("break-glass credential of node %s rotated", agent.settings.node)
        return {"node": agent.settings.node, "credential": credential}

    return app


def _authorize(request: Request, admin_token: str) -> None:
    problem = bearer_problem(request.headers.get("authorization"), admin_token)
    if problem is not None:
        raise ApiError(401, BAD_CREDENTIAL, problem)


async def _reason(request: Request) -> str | None:
    """The body's `reason` or the X-Fleet-Reason header (at most 2000 characters)."""
    reason = request.headers.get("x-fleet-reason")
    body = await request.body()
    if body:
        try:
            parsed = json.loads(body)
        except ValueError:
            raise ApiError(422, "validation_failed", "body: not JSON", "body") from None
        if isinstance(parsed, dict) and parsed.get("reason") is not None:
            if not isinstance(parsed["reason"], str):
                raise ApiError(422, "validation_failed", "reason: must be a string", "reason")
            reason = parsed["reason"]
    if reason is not None and (len(reason) > 2000 or "\x00" in reason):
        raise ApiError(422, "validation_failed", "reason: at most 2000 characters, no NUL", "reason")
    return reason
