"""The FastAPI application: routes, error handlers, the request guard, and the runtime's lifecycle."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

import fleetctl
from fleetctl.controller.api import error_responses, errors
from fleetctl.controller.api.middleware import RequestGuard, route_index
from fleetctl.controller.api.routes_admin import router as admin_router
from fleetctl.controller.api.routes_agents import router as agents_router
from fleetctl.controller.api.routes_breakglass import router as breakglass_router
from fleetctl.controller.api.routes_canary import router as canary_router
from fleetctl.controller.api.routes_canary_refs import router as canary_refs_router
from fleetctl.controller.api.routes_classes import router as classes_router
from fleetctl.controller.api.routes_deployments import router as deployments_router
from fleetctl.controller.api.routes_direct import router as direct_router
from fleetctl.controller.api.routes_drills import router as drills_router
from fleetctl.controller.api.routes_gateways import router as gateways_router
from fleetctl.controller.api.routes_metrics import router as metrics_router
from fleetctl.controller.api.routes_nodes import router as nodes_router
from fleetctl.controller.api.routes_pd import router as pd_router
from fleetctl.controller.api.routes_policy import router as policy_router
from fleetctl.controller.api.routes_rollouts import router as rollouts_router
from fleetctl.controller.api.routes_status import router as status_router
from fleetctl.controller.api.routes_watch import router as watch_router
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.settings import ControllerSettings

ROUTERS = (status_router, agents_router, nodes_router, classes_router, deployments_router, policy_router, breakglass_router, direct_router,
           gateways_router, admin_router, metrics_router, rollouts_router, canary_router, drills_router, canary_refs_router,
           watch_router, pd_router)


def create_app(settings: ControllerSettings | None = None, runtime: ControllerRuntime | None = None) -> FastAPI:
    """An app over `runtime` (or a new one from `settings`, else from the environment). The runtime starts
    (migrations, bootstrap token, reconcile loop) and stops with the app's lifespan."""
    runtime = runtime or ControllerRuntime(settings or ControllerSettings.from_env())

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        runtime.start()
        try:
            yield
        finally:
            runtime.stop()

    app = FastAPI(
        title="fleetctl controller", version=fleetctl.__version__, lifespan=lifespan,
        description="Desired and observed state of an LLM inference fleet. Errors: "
        '{"error": {"code", "message", "field"}}. Auth: Authorization: Bearer <token>.',
    )
    app.state.runtime = runtime
    errors.install(app)
    app.add_middleware(RequestGuard)
    for router in ROUTERS:
        error_responses.declare(router.routes)
        app.include_router(router)
    app.state.route_index = route_index(route for router in ROUTERS for route in router.routes)
    return app
