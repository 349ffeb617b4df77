"""The typed HTTP client of the controller API: the only package that talks HTTP to the controller.

Used by the CLI, the TUI, the agent and the gateway. Every controller route is one `Endpoint` (endpoint.py)
in `ControllerCalls` (calls.py), the call table, declared by family in calls_fleet.py, calls_policy.py,
calls_canary.py and calls_admin.py: its method, path template, response model and a builder that turns the
method's arguments into a request. `ControllerClient` (synchronous, httpx.Client) and
`AsyncControllerClient` (asyncio, httpx.AsyncClient) (clients.py) both inherit the table, so they have the same methods
with the same arguments; the async ones return awaitables. Replies are parsed into the response models of
fleetctl/controller/responses.py (lists of models for lists, dicts of models for maps).

`GET /api/v1/watch` is a stream: its call-table entry (`watch_stream`) yields the reply's lines as they
arrive (`stream`); `watch()` parses them into the change stream's messages (fleetctl/watch_client.py, which
also reconnects: `follow`).

Errors are raised as fleetctl.errors: NotFound, AuthError, Conflict, ValidationFailed (422/413),
Unavailable (503, connection refused, timeout), else FleetError (also for a reply that does not parse).
The token is sent as a bearer header and never appears in messages or reprs.

    client = ControllerClient("http://127.0.0.1:8080", token)
    client.apply_class("chat", {"model": "smollm2-135m", "weights": "smollm2"}, reason="new class").ref
"""

from __future__ import annotations

from fleetctl.client.calls import ControllerCalls
from fleetctl.client.clients import DEFAULT_CONTROLLER, DEFAULT_TIMEOUT_S, AsyncControllerClient, ControllerClient
from fleetctl.client.endpoint import IF_MATCH_HEADER, REASON_HEADER, Call, Endpoint, Request
from fleetctl.errors import FleetError

__all__ = ["AsyncControllerClient", "Call", "ControllerCalls", "ControllerClient", "DEFAULT_CONTROLLER",
           "DEFAULT_TIMEOUT_S", "Endpoint", "FleetError", "IF_MATCH_HEADER", "REASON_HEADER", "Request"]
