"""Sending a routed request: try the ranked engines in order until one gives a first token.

`Dispatcher.try_engines` is the one retry loop (whole requests, P/D prefill and P/D decode all use it):
- at most 1 + max_retries engines, best-ranked first;
- each try is an `InFlight` ticket on the engine (the router sees it at once) and a share of traffic;
- a failure before the first token (upstream.UpstreamFailure) marks the engine (passive health), counts
  fleet_gateway_retries_total{reason} and moves on; a 4xx from the engine (EngineRejected) goes to the
  client as is; when every try failed, UpstreamFailed carries the last status (or 502 / 504).
A streamed try succeeds at its first token (the events before it are held, not yet sent), so a failure
before the first token is invisible to the client apart from the delay.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from fleetctl.gateway.engine_state import EngineLive, InFlight
from fleetctl.gateway.errors import NoRoute, UpstreamFailed
from fleetctl.gateway.probe_traffic import ProbeTokens
from fleetctl.gateway.requests import ClientRequest
from fleetctl.gateway.routing_table import EngineRoute
from fleetctl.gateway.scorer import RankedEngine
from fleetctl.gateway.served import TokenTimes
from fleetctl.gateway.service import GatewayService, Prepared
from fleetctl.gateway.upstream import (
    END,
    EngineRejected,
    PENDING,
    SSEEvent,
    SSEReader,
    UpstreamFailure,
    error_message,
    failure_from_exception,
    is_first_token,
    open_stream,
    post_json,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class RequestContext:
    """One client request, from arrival to the last byte: what the log line and the metrics say about it."""

    request_id: str
    arrived: float = field(default_factory=time.monotonic)
    key_name: str | None = None
    model: str = "unknown"  # a model of the routing table, else "unknown" (bounded metric labels)
    session_id: str | None = None
    served_by: str | None = None  # "<class_ref> <engine>"
    prefilled_by: str | None = None  # P/D: the prefill engine
    forwarded_at: float | None = None
    first_token_at: float | None = None
    class_ref: str | None = None  # the class revision chosen for it (None: refused before a class was chosen)
    inband_status: int | None = None  # a stream that failed before its first token: the status its error event says
    stream_cut: bool = False  # a stream ended with an error event after tokens were sent
    tokens: TokenTimes = field(default_factory=TokenTimes)  # when its content chunks were relayed (streams)
    probe: str | None = None  # a canary probe's kind (probe_traffic.py): kept out of user-facing metrics
    probe_tokens: ProbeTokens = field(default_factory=ProbeTokens)

    def forwarding(self) -> None:
        if self.forwarded_at is None:
            self.forwarded_at = time.monotonic()


@dataclass
class Sent(Generic[T]):
    route: EngineRoute
    live: EngineLive
    ticket: InFlight
    ranked: RankedEngine
    result: T


@dataclass
class StreamStart:
    """A stream at its first token: the held events go to the client first."""

    sent: Sent[tuple[SSEReader, list[SSEEvent]]]

    @property
    def reader(self) -> SSEReader:
        return self.sent.result[0]

    @property
    def held(self) -> list[SSEEvent]:
        return self.sent.result[1]


def route_reason(chosen: RankedEngine, attempt: int, ranked: list[RankedEngine]) -> str:
    """The fleet_gateway_routed_total reason label: retry, session, hot_spot (an engine holding more of the
    prompt was passed over by the hot-spot guard), prefix (the chosen engine holds some of it) or load."""
    if attempt > 0:
        return "retry"
    if chosen.sticky:
        return "session"
    if any(r.hot_spot_damped and r.cached_blocks > chosen.cached_blocks for r in ranked):
        return "hot_spot"
    if chosen.cached_blocks > 0:
        return "prefix"
    return "load"


def engine_body(prepared: Prepared, route: EngineRoute, body: dict[str, Any]) -> dict[str, Any]:
    """The body for a whole request on `route`: the client's, plus the peer to fetch K/V blocks from when the
    cross-node plan chose to fetch for this engine (a retry on another engine goes without it)."""
    plan = prepared.peer_fetch
    if plan is None or not plan.fetch or plan.engine != route.name:
        return body
    return {**body, "kv_transfer_params": plan.kv_transfer_params}


class Dispatcher:
    def __init__(self, service: GatewayService):
        self.service = service
        self.settings = service.settings

    def headers(self, ctx: RequestContext) -> dict[str, str]:
        return {**self.service.engine_headers(), "x-request-id": ctx.request_id}

    async def try_engines(self, ctx: RequestContext, prepared: Prepared, ranked: list[RankedEngine], role: str,
                          max_tokens: int, send: Callable[[EngineRoute, InFlight], Awaitable[T]]) -> Sent[T]:
        if not ranked:
            raise NoRoute(f"no healthy {role} engine for class {prepared.class_ref}: {self.service.describe_unhealthy(prepared)}")
        failures: list[UpstreamFailure] = []
        for attempt, candidate in enumerate(ranked[: 1 + self.settings.max_retries]):
            route, live = prepared.routes[candidate.engine_id], self.service.engines.get(candidate.engine_id)
            if live is None or route.url is None:
                continue
            ticket = live.start(self._ticket(prepared, candidate, role, max_tokens))
            self.service.warmer.yield_to_request(candidate.engine_id)  # a warm never delays a request (warmer.py)
            self._record_route(prepared, candidate, route_reason(candidate, attempt, ranked))
            ctx.forwarding()
            try:
                result = await send(route, ticket)
            except UpstreamFailure as failure:
                live.finish(ticket)
                live.record_failure(failure.reason, failure.hard)
                failures.append(failure)
                log.warning("request %s: %s engine %s failed (%s): %s", ctx.request_id, role, route.name,
                            failure.reason, failure.message)
                self.service.metrics.retries.labels(failure.reason).inc()
                continue
            except EngineRejected:
                live.finish(ticket)
                ctx.served_by = f"{prepared.class_ref} {route.name}"  # the engine answered: a 4xx of its own
                raise
            except BaseException:
                live.finish(ticket)
                raise
            live.record_success()
            return Sent(route, live, ticket, candidate, result)
        raise all_failed(role, failures)

    @staticmethod
    def _ticket(prepared: Prepared, candidate: RankedEngine, role: str, max_tokens: int) -> InFlight:
        block_size = prepared.candidates[candidate.engine_id].view.block_size if candidate.engine_id in prepared.candidates else 0
        cached_tokens = min(candidate.cached_blocks * block_size, len(prepared.prompt_ids))
        return InFlight(len(prepared.prompt_ids), max_tokens, role, cached_tokens=cached_tokens,
                        block_hashes=tuple(prepared.block_hashes))

    def _record_route(self, prepared: Prepared, candidate: RankedEngine, reason: str) -> None:
        self.service.shares.record(candidate.engine_id)
        self.service.metrics.routed.labels(candidate.engine_id, reason).inc()
        if candidate.cached_blocks:
            self.service.index.touch(candidate.engine_id, prepared.block_hashes[: candidate.cached_blocks])

    # --- a whole request on one engine ---

    async def open_whole_stream(self, ctx: RequestContext, prepared: Prepared, request: ClientRequest) -> StreamStart:
        async def send(route: EngineRoute, ticket: InFlight) -> tuple[SSEReader, list[SSEEvent]]:
            return await self.open_until_first_token(route, ticket, request.path, engine_body(prepared, route,
                                                                                               request.body), ctx)

        sent = await self.try_engines(ctx, prepared, prepared.plan.candidates, "whole-request", prepared.max_tokens, send)
        ctx.served_by = f"{prepared.class_ref} {sent.route.name}"
        self.service.sessions.set(ctx.session_id, sent.route.name)
        return StreamStart(sent)

    async def complete_whole(self, ctx: RequestContext, prepared: Prepared, request: ClientRequest) -> Sent[dict[str, Any]]:
        async def send(route: EngineRoute, ticket: InFlight) -> dict[str, Any]:
            return await self.post(route, request.path, engine_body(prepared, route, request.body), ctx)

        sent = await self.try_engines(ctx, prepared, prepared.plan.candidates, "whole-request", prepared.max_tokens, send)
        ctx.served_by = f"{prepared.class_ref} {sent.route.name}"
        self.service.sessions.set(ctx.session_id, sent.route.name)
        return sent

    # --- one engine call ---

    async def post(self, route: EngineRoute, path: str, body: dict[str, Any], ctx: RequestContext,
                   total_s: float | None = None) -> dict[str, Any]:
        """A non-streamed call; `total_s` defaults to the whole-answer timeout."""
        answer, _ = await post_json(self.service.engine_client, route.url or "", path, body, self.headers(ctx),
                                    self.settings.connect_timeout_s, total_s or self.settings.request_timeout_s)
        return answer

    async def open_until_first_token(self, route: EngineRoute, ticket: InFlight, path: str, body: dict[str, Any],
                                     ctx: RequestContext) -> tuple[SSEReader, list[SSEEvent]]:
        url = route.url or ""
        response = await open_stream(self.service.engine_client, url, path, body, self.headers(ctx),
                                     self.settings.connect_timeout_s, self.settings.first_token_timeout_s)
        reader = SSEReader(response)
        try:
            held = await self.wait_first_token(reader, url)
        except BaseException:
            await reader.close()
            raise
        ticket.first_token_at = time.monotonic()
        return reader, held

    async def wait_first_token(self, reader: SSEReader, url: str) -> list[SSEEvent]:
        """Events up to and including the first that carries output; UpstreamFailure if none comes in time."""
        deadline = time.monotonic() + self.settings.first_token_timeout_s
        held: list[SSEEvent] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise UpstreamFailure("timeout", f"{url}: no first token after {self.settings.first_token_timeout_s:g}s", hard=True)
            try:
                event = await reader.next(remaining)
            except Exception as exc:  # a transport error while reading
                raise failure_from_exception(exc, url) from None
            if event is PENDING:
                continue
            if event is END:
                raise UpstreamFailure("disconnect", f"{url}: the stream ended before the first token", hard=True)
            if event.is_comment:
                continue
            if is_first_token(event):
                if "error" in (event.json() or {}):
                    raise UpstreamFailure("error_event", f"{url}: {error_message(event.data.encode() if event.data else b'')}")
                held.append(event)
                return held
            held.append(event)


def all_failed(role: str, failures: list[UpstreamFailure]) -> UpstreamFailed:
    """The error for a request no engine could start: the last engine's status where it answered one."""
    summary = "; ".join(f.message for f in failures) or "no engine could be tried"
    last = failures[-1] if failures else None
    if last is not None and last.status is not None:
        status = last.status
    elif last is not None and last.reason == "timeout":
        status = 504
    else:
        status = 502
    retry_after = None
    if last is not None and last.retry_after and last.retry_after.isdigit():
        retry_after = int(last.retry_after)
    elif status in (429, 503):
        retry_after = 1
    return UpstreamFailed(f"no {role} engine could serve the request: {summary}", status, retry_after)
