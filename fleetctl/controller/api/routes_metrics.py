"""GET /metrics: the controller's Prometheus metrics (fleetctl/controller/metrics.py) in the text
exposition format. No auth, like the engines' and the gateway's /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from fastapi.responses import PlainTextResponse

from fleetctl.controller.api.deps import get_runtime
from fleetctl.controller.metrics import EXPOSITION_CONTENT_TYPE
from fleetctl.controller.runtime import ControllerRuntime

router = APIRouter(tags=["fleet"])


@router.get("/metrics", name="metrics", response_class=PlainTextResponse,
            responses={200: {"description": "the Prometheus text exposition format"}})
def metrics(runtime: ControllerRuntime = Depends(get_runtime)) -> Response:
    return Response(runtime.metrics.exposition(), media_type=EXPOSITION_CONTENT_TYPE)
