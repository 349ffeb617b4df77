"""The change stream (`GET /api/v1/watch`, server-sent events; fleetctl/controller/watch_contract.py is its wire
format, watch_hub.py its publisher) and `GET /api/v1/whoami` (the caller's token: a viewer token may only
read, which is how the TUI knows to offer no actions). Both need a viewer token.

The stream passes through the request guard unbuffered (it taps only an error's body) and is not audited
(a GET changes nothing); it ends when the client leaves or the controller shuts down.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from fleetctl.controller.api.deps import get_runtime, require
from fleetctl.controller.auth import VIEWER, Principal
from fleetctl.controller.responses import WhoAmI
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.watch_contract import WATCH_PATH

router = APIRouter(tags=["watch"])
TOKEN_MAX = 100  # an EPOCH-SEQ token is far shorter
EVENT_STREAM = "text/event-stream"
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy may hold events back
STREAM_RESPONSE = {200: {"description": "server-sent events: snapshot, delta and ping, each with its resume "
                                        "token as `id` and one line of JSON as `data` (WatchSnapshot, WatchDelta, "
                                        "WatchPing in fleetctl/controller/watch_contract.py)",
                         "content": {EVENT_STREAM: {"schema": {"type": "string"}}}}}


@router.get(WATCH_PATH, name="watch", response_class=StreamingResponse, responses=STREAM_RESPONSE,
            dependencies=[Depends(require(VIEWER))])
async def watch(
    resume: Annotated[str | None, Query(max_length=TOKEN_MAX, description="the last token seen (as Last-Event-ID)")] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=TOKEN_MAX,
                                                description="the last token seen: the missed deltas, or a snapshot")] = None,
    runtime: ControllerRuntime = Depends(get_runtime),
) -> StreamingResponse:
    """A snapshot of every watched resource, then a delta per change and a ping after each `ping_s` of
    silence. With the last token seen (`Last-Event-ID` or `resume`): only the deltas after it when this
    process still holds them, else a snapshot."""
    await run_in_threadpool(runtime.watch.prepare)  # a database that is down is a 503 here, not a broken stream
    return StreamingResponse(runtime.watch.stream(last_event_id or resume), media_type=EVENT_STREAM,
                             headers=STREAM_HEADERS)


@router.get("/api/v1/whoami", name="whoami", response_model=WhoAmI)
def whoami(principal: Principal = Depends(require(VIEWER))) -> WhoAmI:
    return WhoAmI(name=principal.name, role=principal.role)
