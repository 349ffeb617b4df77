"""Cross-node KV fetch, the engine's two sides (fleetctl/gateway/cross_node.py decides when to ask for one).

Asking. The gateway names a peer in the request's `kv_transfer_params`: `{"tier_peer": "<peer engine URL>",
"tier_peer_node": "<its node>"}`. The engine asks that peer for the prompt's blocks after its own memory's
leading run, exactly as it asks its own node's tier (kv_tier_client.TierFetcher, same body, same tier frame:
layout, hash, tokens and a CRC-32 per block, all checked). A peer that answers nothing, fails a check, errs or
takes longer than `kv_tier_timeout_s` is dropped for this request, and the engine goes on as without it: its
own tier, then recompute. Counted per source node (blocks, seconds, failures), so the gateway measures the
bandwidth between the two nodes from the engine's metrics.

Answering. `POST /kv/tier/fetch` (the engine's API key, as the P/D routes) reads the engine's node tier for the
asker: the body is passed to the agent's fetch route with the node's tier credential, which never leaves the
node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, Request, Response

from engine.contract.kv_tier import MEDIA_HEADER, TIER_FRAME_MEDIA_TYPE
from engine.errors import InvalidRequest, openapi_error_responses

if TYPE_CHECKING:
    from engine.reference.kv_tier_client import KVTierLink

PEER_URL_PARAM = "tier_peer"
PEER_NODE_PARAM = "tier_peer_node"
_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # a metric label value: bounded and plain
_URL_RE = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/\-]*)?$")


def peer_source(kv_transfer_params: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(peer URL, its node) the gateway named, or None; a malformed one is the caller's 400."""
    if not kv_transfer_params or PEER_URL_PARAM not in kv_transfer_params:
        return None
    url, node = kv_transfer_params.get(PEER_URL_PARAM), kv_transfer_params.get(PEER_NODE_PARAM)
    if not isinstance(url, str) or not _URL_RE.match(url):
        raise InvalidRequest("must be the peer engine's http(s) base URL",
                             param=f"kv_transfer_params.{PEER_URL_PARAM}")
    if not isinstance(node, str) or not _NODE_RE.match(node):
        raise InvalidRequest("must name the peer's node (letters, digits, . _ -; at most 63)",
                             param=f"kv_transfer_params.{PEER_NODE_PARAM}")
    return url.rstrip("/"), node


def peer_router(link: KVTierLink, auth: Any) -> APIRouter:
    router = APIRouter(dependencies=[Depends(auth)], responses=openapi_error_responses(401, 502))

    @router.post("/kv/tier/fetch", response_class=Response)
    async def tier_fetch(request: Request) -> Response:
        """The leading run of the asked blocks this engine's node tier holds (a tier frame), for a peer engine."""
        status, frame, media = await link.serve_peer(await request.body())
        return Response(frame, status_code=status, media_type=TIER_FRAME_MEDIA_TYPE if status == 200 else None,
                        headers={MEDIA_HEADER: media} if status == 200 else None)

    return router
