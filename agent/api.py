"""The agent's small local API: what runs here, and break-glass actions that need no controller.

    GET  /health                     the agent is up; how its link to the controller stands
    GET  /engines                    observed state of every engine (the heartbeat's `engines`)
    POST /engines/{name}/drain       break-glass (admin token): stop taking requests, finish, exit
    POST /engines/{name}/restart     break-glass: restart the process (lifts a drain/stop hold)
    POST /engines/{name}/stop        break-glass: SIGTERM now (the engine drains within its grace)

Break-glass calls need `Authorization: Bearer <admin token>`, compared in constant time. A drained or stopped
engine stays down until the controller sends a new assignment generation. Errors have the controller's shape
{"error": {"code", "message", "field"}}.
"""

from __future__ import annotations

import hmac
import logging
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

if TYPE_CHECKING:
    from agent.runtime import Agent

log = logging.getLogger("fleetctl.agent.api")

BREAK_GLASS_ACTIONS = ("drain", "restart", "stop")


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
        _authorize(request, agent.settings.admin_token)
        if action not in BREAK_GLASS_ACTIONS:
            raise ApiError(404, "not_found", f"unknown action {action!r}; one of {', '.join(BREAK_GLASS_ACTIONS)}", "action")
        if name not in agent.supervisor.slots:
            raise ApiError(404, "not_found", f"no engine {name!r} on node {agent.settings.node}", "name")
        client = request.client.host if request.client else "?"
        log.warning("break-glass: %s %s requested from %s", action, name, client)
        agent.break_glass(name, action)  # type: ignore[arg-type]
        return {"engine": name, "action": action, "accepted": True}

    return app


def _authorize(request: Request, admin_token: str) -> None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "unauthorized", "break-glass actions need 'Authorization: Bearer <admin token>'")
    if not hmac.compare_digest(token.encode(), admin_token.encode()):
        raise ApiError(401, "unauthorized", "the admin token is not valid")
