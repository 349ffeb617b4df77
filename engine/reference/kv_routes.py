"""The /kv/* HTTP routes of P/D, all behind the engine's API key:

    POST /kv/pull {"request_id", "block_ids"}  ->  a K/V frame (engine.reference.kv_wire); the blocks are freed
    POST /kv/push  <a K/V frame>               ->  {"staged": [logical indices]}   (the push extension)
    POST /kv/release {"request_id"}            ->  {"released": bool}   (free without pulling)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel

from engine.contract.bounds import Count, SafeStr
from engine.errors import openapi_error_responses
from engine.reference.kv_wire import FRAME_MEDIA_TYPE

if TYPE_CHECKING:
    from engine.reference.kv_transfer import KVTransfer


class PullRequest(BaseModel):
    request_id: SafeStr
    block_ids: list[Count]


class ReleaseRequest(BaseModel):
    request_id: SafeStr


def kv_router(kv: KVTransfer, auth: Callable[..., Any]) -> APIRouter:
    """The routes over `kv`; `auth` checks the API key."""
    router = APIRouter(dependencies=[Depends(auth)], responses=openapi_error_responses(400, 401))

    @router.post("/kv/pull", response_class=Response,
                 responses={200: {"content": {FRAME_MEDIA_TYPE: {}}, "description": "the K/V frame"}})
    async def kv_pull(body: PullRequest) -> Response:
        return Response(await kv.prefill.serve_pull(body.request_id, body.block_ids), media_type=FRAME_MEDIA_TYPE)

    @router.post("/kv/push")
    async def kv_push(request: Request) -> dict:
        return {"staged": await kv.decode.serve_push(await request.body())}

    @router.post("/kv/release")
    async def kv_release(body: ReleaseRequest) -> dict:
        return {"released": await kv.prefill.release(body.request_id)}

    return router
