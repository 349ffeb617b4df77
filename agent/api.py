"""The agent's small local API: what runs here, and break-glass actions that need no controller.

    GET  /health                     the agent is up; how its link to the controller stands
    GET  /engines                    observed state of every engine (the heartbeat's `engines`)
    POST /engines/{name}/drain       break-glass: stop taking requests, finish, exit
    POST /engines/{name}/restart     break-glass: restart the process (lifts a drain/stop hold)
    POST /engines/{name}/stop        break-glass: SIGTERM now (the engine drains within its grace)
    GET  /direct                     break-glass: the direct-action journal and the holds in force
    POST /direct/rotate              break-glass: a new credential (the old one stops working at once)
    POST /kv/tiers/{class}/blocks    the node's engines: offload evicted blocks (a tier frame)
    POST /kv/tiers/{class}/fetch     the node's engines: the leading run of blocks held, {layout, hashes, tokens}
    GET  /kv/tiers/{class}/events    the node's engines: what the tiers now hold, ?layout=&after=SEQ
    GET  /kv/status                  each class's tiers: size, use, hits, fetch time, corrupt blocks
    POST /kv/flush                   operator: drop the blocks of a class's tiers, {class?, tier?, reason}

The tier routes of engines need `Authorization: Bearer <the agent's tier token>`, which the agent gives the
engines it launches (a block stored there is loaded into other engines' caches, so not just anyone may store
one); a flush needs the break-glass credential.

Break-glass calls need `Authorization: Bearer <credential>`: this node's break-glass credential (the admin
token file), compared in constant time. A body `{"reason": ...}` or an X-Fleet-Reason header says why. Each
action is written to the direct-action journal (fsynced) before it is done, and uploaded to the controller
when it is reachable. A drained or stopped engine stays down, whatever the controller assigns, until the
operator adopts or reverts the action (`fleetctl breakglass reconcile`) or restarts it here. Errors have the
controller's shape {"error": {"code", "message", "field"}}.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from agent.kv_tiers.registry import TierRegistry
from agent.kv_tiers.store import TIER_NAMES, TierStore
from engine.contract.direct import bearer_problem, new_credential, write_atomically
from engine.contract.kv_tier import (HASH_MAX, MEDIA_HEADER, TIER_FRAME_MEDIA_TYPE, TierFrameError, decode_tier_frame,
                                     encode_tier_frame, valid_layout)
from engine.contract.kv_tier_report import TierReport
from engine.kv_events import BlockStored, KVEvent

if TYPE_CHECKING:
    from agent.runtime import Agent

log = logging.getLogger("fleetctl.agent.api")

BREAK_GLASS_ACTIONS = ("drain", "restart", "stop")
MAX_FETCH_BLOCKS = 4096
BAD_CREDENTIAL = "bad_credential"  # not the controller's "unauthorized": the fix is the node's credential file


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


def make_api(agent: "Agent") -> FastAPI:
    app = FastAPI(title="fleetctl agent", summary="local observed state and break-glass actions")

    render_api_errors(app)

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

    kv_routes(app, agent.supervisor.tiers, agent.settings.node, tier_token=lambda: agent.settings.kv_tier_token,
              credential=lambda: agent.credential)
    return app


def render_api_errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _render(_: Request, exc: ApiError) -> JSONResponse:
        body = {"error": {"code": exc.code, "message": exc.message, "field": exc.field}}
        return JSONResponse(body, status_code=exc.status)


def kv_routes(app: FastAPI, tiers: TierRegistry, node: str, *, tier_token: Callable[[], str],
              credential: Callable[[], str]) -> None:
    """The tier routes (module doc) over `tiers`; engines authenticate with tier_token(), a flush with
    credential() (the break-glass credential, which a rotation replaces)."""
    render_api_errors(app)

    def store_of(class_name: str) -> TierStore:
        store = tiers.get(class_name)
        if store is None:
            raise ApiError(404, "not_found", f"no KV tier for class {class_name!r} on node {node}",
                           "class")
        return store

    @app.post("/kv/tiers/{class_name}/blocks")
    async def offload(class_name: str, request: Request) -> dict[str, Any]:
        _authorize(request, tier_token())
        store = store_of(class_name)
        try:
            _, blocks = await asyncio.to_thread(decode_tier_frame, await request.body())
        except TierFrameError as exc:
            raise ApiError(400, "bad_frame", f"tier frame refused ({exc.reason}): {exc}", "body") from None
        return {"taken": await asyncio.to_thread(store.offload, blocks)}

    @app.post("/kv/tiers/{class_name}/fetch")
    async def fetch(class_name: str, request: Request) -> Response:
        _authorize(request, tier_token())
        store = store_of(class_name)
        layout, hashes, tokens = _fetch_body(await _json_body(request))
        found = await asyncio.to_thread(store.fetch, layout, hashes, tokens)
        frame = encode_tier_frame(layout, found.blocks)
        return Response(frame, media_type=TIER_FRAME_MEDIA_TYPE, headers={MEDIA_HEADER: ",".join(found.media)})

    @app.get("/kv/tiers/{class_name}/events")
    async def events(class_name: str, request: Request, layout: str = "", after: int = -1) -> dict[str, Any]:
        """{"seq", "events": [[kind ("stored"|"removed"), hash, medium], ...], "snapshot": [[hash, [media]]]|null}"""
        _authorize(request, tier_token())
        store = store_of(class_name)
        if not valid_layout(layout):
            raise ApiError(422, "validation_failed", "layout: 16-64 lowercase hex digits", "layout")
        page = await asyncio.to_thread(store.events_since, layout, after)
        return {"seq": page.seq, "events": [_event_row(e) for e in page.events],
                "snapshot": None if page.snapshot is None else [[h, m] for h, m in page.snapshot.items()]}

    @app.get("/kv/status")
    async def kv_status() -> dict[str, Any]:
        reports = [TierReport.model_validate(row) for row in tiers.reports()]
        rows = [{**r.model_dump(), "hit_rate": r.hit_rate, "mean_fetch_s": r.mean_fetch_s} for r in reports]
        return {"node": node, "disk_enabled": tiers.disk_enabled, "tiers": rows}

    @app.post("/kv/flush")
    async def flush(request: Request) -> dict[str, Any]:
        _authorize(request, credential())
        body = await _json_body(request) if await request.body() else {}
        class_name, tier = body.get("class"), body.get("tier")
        if tier not in (None, *TIER_NAMES):
            raise ApiError(422, "validation_failed", f"tier: one of {', '.join(TIER_NAMES)}", "tier")
        stores = [(class_name, store_of(class_name))] if class_name is not None else tiers.items()
        log.warning("KV tier flush on node %s: class %s, tier %s", node, class_name or "all", tier or "all")
        dropped = {name: await asyncio.to_thread(store.flush, tier) for name, store in stores}
        return {"node": node, "dropped": dropped}


def _event_row(event: KVEvent) -> list[Any]:
    kind = "stored" if isinstance(event, BlockStored) else "removed"
    return [kind, event.block_hashes[0], event.medium]


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise ApiError(422, "validation_failed", "body: not JSON", "body") from None
    if not isinstance(body, dict):
        raise ApiError(422, "validation_failed", "body: must be an object", "body")
    return body


def _fetch_body(body: dict[str, Any]) -> tuple[str, list[int], list[list[int]]]:
    layout, hashes, tokens = body.get("layout"), body.get("hashes"), body.get("tokens")
    if not valid_layout(layout):
        raise ApiError(422, "validation_failed", "layout: 16-64 lowercase hex digits", "layout")
    if not isinstance(hashes, list) or len(hashes) > MAX_FETCH_BLOCKS or not all(_is_uint(h, HASH_MAX) for h in hashes):
        raise ApiError(422, "validation_failed", f"hashes: at most {MAX_FETCH_BLOCKS} unsigned 64-bit ints", "hashes")
    if (not isinstance(tokens, list) or len(tokens) != len(hashes)
            or not all(isinstance(t, list) and all(_is_uint(x, 1 << 31) for x in t) for t in tokens)):
        raise ApiError(422, "validation_failed", "tokens: one list of token ids per hash", "tokens")
    return layout, hashes, tokens


def _is_uint(value: object, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit


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
