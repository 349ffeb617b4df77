"""The request guard (pure ASGI): body size limit, payload digest and reason for the audit log, and the
audit record of refused (4xx) and failed (5xx) mutations.

Every request's body is read here first (at most `max_body_bytes`; more is a 413) and replayed to the app.
For mutating calls (POST/PUT/PATCH/DELETE under /api/v1, except the high-rate agent heartbeat and gateway
report, which report observed state rather than change the fleet) the
handler records success in its own transaction; when the response is an error, the change was rolled
back and this middleware records the refusal instead, so every mutating call leaves exactly one event.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.contract.bounds import find_unsafe_text, text_problem
from fleetctl.controller import audit
from fleetctl.controller.auth import UNAUTHENTICATED, bearer, identify
from fleetctl.errors import ValidationFailed

log = logging.getLogger(__name__)

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
NOT_AUDITED = frozenset({"/api/v1/agents/heartbeat", "/api/v1/gateways/report"})  # reports, not changes
REASON_HEADER = "x-fleet-reason"
CONTEXT_KEY = "fleet.request"


@dataclass
class RequestContext:
    """What the handlers' audit records need from the raw request."""

    digest: str
    reason: str | None
    name: str | None = None  # the body's `name`, the audit target when the path names none
    unsafe: ValidationFailed | None = None  # a string in the request that cannot be stored (`unsafe_text`)

    @classmethod
    def of(cls, scope: Scope, body: bytes) -> "RequestContext":
        parsed = _json_object(body)
        name = parsed.get("name")
        reason = _reason(scope, parsed)
        unsafe = unsafe_text(scope, parsed)
        return cls(audit.payload_digest(body), None if unsafe else reason, name if isinstance(name, str) else None, unsafe)


class TooLarge(Exception):
    pass


class RequestGuard:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        runtime = scope["app"].state.runtime
        audited = _audited(scope)
        try:
            body = await _read_body(scope, receive, runtime.settings.max_body_bytes)
        except TooLarge:
            await self._refuse_too_large(runtime, scope, send, audited)
            return
        report = scope.get("path") in NOT_AUDITED
        # reports are neither audited nor named: skip parsing and hashing the body of the highest-rate calls
        context = RequestContext("", None) if report else RequestContext.of(scope, body)
        scope[CONTEXT_KEY] = context
        if context.unsafe is not None:
            await self._refuse(runtime, scope, send, context, audited, context.unsafe)
            return
        if not report:
            await _read_your_beats(runtime)
        response = _ResponseTap(send)
        try:
            await self.app(scope, _replay(body, receive), response.send)
        except Exception:
            if audited:
                await run_in_threadpool(_record_refusal, runtime, scope, context, 500, "internal")
            raise
        if audited and response.status >= 400:
            await run_in_threadpool(_record_refusal, runtime, scope, context, response.status, response.error_code())
        elif audited and runtime.heartbeats is not None:
            # refresh the cached assignments now: the change reaches the agents on their next beat
            await run_in_threadpool(runtime.flush_heartbeats)

    async def _refuse_too_large(self, runtime: Any, scope: Scope, send: Send, audited: bool) -> None:
        limit = runtime.settings.max_body_bytes
        error = ValidationFailed(f"body: larger than {limit} bytes", code="payload_too_large", status=413, field="body")
        await self._refuse(runtime, scope, send, RequestContext.of(scope, b""), audited, error)

    @staticmethod
    async def _refuse(runtime: Any, scope: Scope, send: Send, context: RequestContext, audited: bool,
                      error: ValidationFailed) -> None:
        """Answer before the app runs (nothing was attempted), recording the refusal of a mutating call."""
        if audited:
            await run_in_threadpool(_record_refusal, runtime, scope, context, error.status, error.code)
        await _send_json(send, error.status, error.to_body())


async def _read_your_beats(runtime: Any) -> None:
    """Store the heartbeats this controller has accepted but not yet written (heartbeats.HeartbeatBuffer)
    before any other call, so whatever it reads or checks sees them.
    A flush that fails (the database is unreachable) does not fail the call: the beats stay queued, and the
    call meets the database itself and answers for what it finds there."""
    buffer = runtime.heartbeats
    if buffer is not None and buffer.pending:
        await run_in_threadpool(runtime.flush_heartbeats)


def unsafe_text(scope: Scope, body: dict[str, Any]) -> ValidationFailed | None:
    """A 422 naming the first place in the request (path, query, reason, JSON body) holding a string that
    cannot be stored: a NUL (PostgreSQL's text refuses it) or an unpaired surrogate (it cannot be encoded).
    One check for every route, so no handler, audit record or error message ever meets such a string."""
    raw_path = scope.get("raw_path") or scope.get("path", "").encode("utf-8", "surrogatepass")
    places: list[tuple[str, Any]] = [
        ("path", unquote(raw_path.decode("latin-1"), errors="surrogateescape")),
        ("query", unquote(scope.get("query_string", b"").decode("latin-1"), errors="surrogateescape")),
        ("X-Fleet-Reason", unquote(_header(scope, REASON_HEADER) or "", errors="surrogateescape")),
    ]
    for field, value in places:
        problem = text_problem(value)
        if problem:
            return ValidationFailed(f"{field}: {problem}", field=field)
    found = find_unsafe_text(body)
    if found:
        where, problem = found
        return ValidationFailed(f"{where}: {problem}", field=where)
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that yields the already-read body once, then defers to the real one (disconnects)."""
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if delivered:
            return await receive()
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class _ResponseTap:
    """Passes the response through, keeping its status and (for errors) the start of its body."""

    def __init__(self, send: Send):
        self._send = send
        self.status = 0
        self._error_body = bytearray()

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body" and self.status >= 400 and len(self._error_body) < 65536:
            self._error_body.extend(message.get("body", b""))
        await self._send(message)

    def error_code(self) -> str | None:
        error = _json_object(bytes(self._error_body)).get("error")
        return error.get("code") if isinstance(error, dict) else None


def _audited(scope: Scope) -> bool:
    path = scope.get("path", "")
    return scope.get("method") in MUTATING and path.startswith("/api/v1/") and path not in NOT_AUDITED


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    declared = _header(scope, "content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TooLarge()
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge()
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _header(scope: Scope, name: str) -> str | None:
    for key, value in scope.get("headers", []):
        if key.decode("latin-1").lower() == name:
            return value.decode("latin-1")
    return None


def _reason(scope: Scope, body: dict[str, Any]) -> str | None:
    """X-Fleet-Reason (percent-encoded UTF-8), else the body's `reason` field."""
    header = _header(scope, REASON_HEADER)
    if header:
        return unquote(header)[:2000]
    reason = body.get("reason")
    return reason[:2000] if isinstance(reason, str) and reason else None


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


@dataclass(frozen=True)
class RouteEntry:
    methods: frozenset[str]
    pattern: re.Pattern[str]
    name: str


def route_index(routes: Iterable[Any]) -> list[RouteEntry]:
    """(methods, path regex, name) of our API routes, for naming the action of a refused call, including
    calls refused before routing (413)."""
    return [RouteEntry(frozenset(r.methods or ()), r.path_regex, r.name) for r in routes if hasattr(r, "path_regex")]


def _route(scope: Scope) -> tuple[str, dict[str, Any]] | None:
    for entry in scope["app"].state.route_index:
        match = entry.pattern.match(scope.get("path", ""))
        if match and scope.get("method") in entry.methods:
            return entry.name, match.groupdict()
    return None


def _record_refusal(runtime: Any, scope: Scope, context: RequestContext, status: int, code: str | None) -> None:
    route = _route(scope)
    if route is None:
        return  # not a route of ours (404 on an unknown path): nothing was attempted
    action, params = route
    target = "/".join(str(v) for v in params.values()) or context.name or ""
    if text_problem(target):  # a refused name that cannot be stored: record it escaped
        target = target.encode("unicode_escape").decode("ascii")
    entry = audit.AuditRecord(
        actor=_actor(runtime, scope), action=action, target=target, reason=context.reason, payload_digest=context.digest,
        result=audit.REFUSED if status < 500 else audit.ERROR, status=status, code=code,
    )
    try:
        with runtime.store.session() as session:
            audit.record(session, entry, runtime.clock())
    except Exception:
        log.exception("could not record the audit event of a refused %s", action)


def _actor(runtime: Any, scope: Scope) -> str:
    principal = scope.get("state", {}).get("principal")
    if principal is not None:
        return principal.name
    token = bearer(_header(scope, "authorization"))
    if token is None:
        return UNAUTHENTICATED
    with runtime.store.session() as session:
        found = identify(session, token, runtime.env_token_sha256)
    return found.name if found else UNAUTHENTICATED
