"""The typed HTTP client of the controller API: the only module that talks HTTP to the controller.

Used by the CLI, the TUI, the agent and the gateway. `ControllerClient` is synchronous;
`AsyncControllerClient` has the calls asyncio services need (agent: register/heartbeat; gateway: routing,
report_gateway).
Errors are raised as fleetctl.errors: NotFound, AuthError, Conflict, ValidationFailed (422/413),
Unavailable (503, connection refused, timeout), else FleetError. The token is sent as a bearer header and
never appears in messages or reprs.

    client = ControllerClient("http://127.0.0.1:8080", token)
    client.apply_class("chat", {"model": "smollm2-135m", "weights": "smollm2"}, reason="new class")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from fleetctl.errors import FleetError, Unavailable, error_from_body
from fleetctl.httpwire import KEEPALIVE_EXPIRY_S  # below uvicorn's 5 s keep-alive (httpx's default is 5 s)

DEFAULT_CONTROLLER = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_S = 10.0
REASON_HEADER = "X-Fleet-Reason"


@dataclass(frozen=True)
class Call:
    """One API request, built the same way for the sync and the async client."""

    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None
    reason: str | None = None

    def headers(self) -> dict[str, str]:
        return {REASON_HEADER: quote(self.reason)} if self.reason else {}


def _seg(value: str) -> str:
    return quote(value, safe="")


def _params(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _result(response: httpx.Response) -> Any:
    try:
        body = response.json() if response.content else None
    except ValueError:
        body = None
    if response.status_code >= 400:
        raise error_from_body(response.status_code, body)
    return body


def _unreachable(base_url: str, exc: httpx.HTTPError) -> Unavailable:
    kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "unreachable"
    return Unavailable(f"controller at {base_url} {kind} ({type(exc).__name__})")


def _client_kwargs(base_url: str, token: str | None, timeout: float) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return {"base_url": base_url.rstrip("/"), "headers": headers, "timeout": timeout,
            "limits": httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)}


# --- the calls, shared by both clients ---

def register_agent_call(payload: dict[str, Any]) -> Call:
    return Call("POST", "/api/v1/agents/register", json=payload)


def heartbeat_call(payload: dict[str, Any]) -> Call:
    return Call("POST", "/api/v1/agents/heartbeat", json=payload)


def report_gateway_call(payload: dict[str, Any]) -> Call:
    return Call("POST", "/api/v1/gateways/report", json=payload)


def set_traffic_call(model: str, weights: dict[str, float], allow_correctness_change: bool, reason: str | None) -> Call:
    body = {"weights": weights, "allow_correctness_change": allow_correctness_change}
    return Call("PUT", f"/api/v1/traffic/{_seg(model)}", json=body, reason=reason)


ROUTING = Call("GET", "/api/v1/routing")
GATEWAYS = Call("GET", "/api/v1/gateways")
STATUS = Call("GET", "/api/v1/status")
HEALTH = Call("GET", "/healthz")


class ControllerClient:
    """Synchronous client. Use as a context manager, or call close()."""

    def __init__(self, base_url: str = DEFAULT_CONTROLLER, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.BaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(transport=transport, **_client_kwargs(base_url, token, timeout))

    def __repr__(self) -> str:
        return f"ControllerClient({self.base_url!r})"

    def __enter__(self) -> "ControllerClient":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def send(self, call: Call) -> Any:
        try:
            response = self._http.request(call.method, call.path, json=call.json, params=call.params, headers=call.headers())
        except httpx.HTTPError as exc:
            raise _unreachable(self.base_url, exc) from None
        return _result(response)

    # agents and gateways
    def register_agent(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self.send(register_agent_call(payload))

    def heartbeat(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self.send(heartbeat_call(payload))

    def routing(self) -> dict[str, Any]:
        return self.send(ROUTING)

    def report_gateway(self, payload: dict[str, Any]) -> dict[str, Any]:
        """{name, url?, generation, table_age_s, refresh_interval_s?}: the routing table a gateway applied."""
        return self.send(report_gateway_call(payload))

    def list_gateways(self) -> list[dict[str, Any]]:
        """Each gateway's last report: generation, last_seen, seen_ago_s, stale."""
        return self.send(GATEWAYS)

    # fleet
    def health(self) -> dict[str, Any]:
        return self.send(HEALTH)

    def status(self) -> dict[str, Any]:
        return self.send(STATUS)

    def list_nodes(self) -> list[dict[str, Any]]:
        return self.send(Call("GET", "/api/v1/nodes"))

    def get_node(self, name: str) -> dict[str, Any]:
        return self.send(Call("GET", f"/api/v1/nodes/{_seg(name)}"))

    def cordon_node(self, name: str, reason: str | None = None) -> dict[str, Any]:
        return self.send(Call("POST", f"/api/v1/nodes/{_seg(name)}/cordon", reason=reason))

    def uncordon_node(self, name: str, reason: str | None = None) -> dict[str, Any]:
        return self.send(Call("POST", f"/api/v1/nodes/{_seg(name)}/uncordon", reason=reason))

    def drain_node(self, name: str, reason: str | None = None) -> dict[str, Any]:
        return self.send(Call("POST", f"/api/v1/nodes/{_seg(name)}/drain", reason=reason))

    def list_engines(self, node: str | None = None) -> list[dict[str, Any]]:
        return self.send(Call("GET", "/api/v1/engines", params=_params(node=node)))

    def get_engine(self, name: str) -> dict[str, Any]:
        return self.send(Call("GET", f"/api/v1/engines/{_seg(name)}"))

    def drain_engine(self, name: str, reason: str | None = None) -> dict[str, Any]:
        return self.send(Call("POST", f"/api/v1/engines/{_seg(name)}/drain", reason=reason))

    # replica classes
    def apply_class(self, name: str, spec: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        """The revision; `result` is "created" (201) or "unchanged" (identical content, 200)."""
        return self.send(Call("POST", "/api/v1/classes", json={"name": name, "spec": spec}, reason=reason))

    def get_class(self, ref: str) -> dict[str, Any]:
        return self.send(Call("GET", f"/api/v1/classes/{_seg(ref)}"))

    def list_classes(self) -> list[dict[str, Any]]:
        return self.send(Call("GET", "/api/v1/classes"))

    def class_history(self, name: str) -> list[dict[str, Any]]:
        return self.send(Call("GET", f"/api/v1/classes/{_seg(name)}/history"))

    # deployments
    def set_deployment(self, name: str, class_ref: str, replicas: int, role: str = "mixed",
                       placement: dict[str, str] | None = None, model: str | None = None,
                       reason: str | None = None) -> dict[str, Any]:
        body = {"class_ref": class_ref, "replicas": replicas, "role": role, "placement": placement or {}}
        if model is not None:
            body["model"] = model
        return self.send(Call("PUT", f"/api/v1/deployments/{_seg(name)}", json=body, reason=reason))

    def list_deployments(self) -> list[dict[str, Any]]:
        return self.send(Call("GET", "/api/v1/deployments"))

    def get_deployment(self, name: str) -> dict[str, Any]:
        return self.send(Call("GET", f"/api/v1/deployments/{_seg(name)}"))

    def delete_deployment(self, name: str, reason: str | None = None) -> dict[str, Any]:
        return self.send(Call("DELETE", f"/api/v1/deployments/{_seg(name)}", reason=reason))

    # traffic and flags
    def list_traffic(self) -> dict[str, Any]:
        return self.send(Call("GET", "/api/v1/traffic"))

    def get_traffic(self, model: str) -> dict[str, Any]:
        """The model's weights and, per revision, ready engines and correctness fields."""
        return self.send(Call("GET", f"/api/v1/traffic/{_seg(model)}"))

    def set_traffic(self, model: str, weights: dict[str, float], allow_correctness_change: bool = False,
                    reason: str | None = None) -> dict[str, Any]:
        """Stored weights and the routing `generation` that includes them. A split over revisions whose
        correctness fields differ is a Conflict (`correctness_split_refused`) unless allowed."""
        return self.send(set_traffic_call(model, weights, allow_correctness_change, reason))

    def list_flags(self) -> dict[str, Any]:
        return self.send(Call("GET", "/api/v1/flags"))

    def set_flag(self, name: str, value: bool | int | float | str, reason: str | None = None) -> dict[str, Any]:
        return self.send(Call("PUT", f"/api/v1/flags/{_seg(name)}", json={"value": value}, reason=reason))

    # audit and tokens
    def list_audit(self, since: str | None = None, actor: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        return self.send(Call("GET", "/api/v1/audit", params=_params(since=since, actor=actor, limit=limit)))

    def create_token(self, name: str, role: str, reason: str | None = None) -> dict[str, Any]:
        """The new token is in `token`; it is shown only here."""
        return self.send(Call("POST", "/api/v1/tokens", json={"name": name, "role": role}, reason=reason))

    def list_tokens(self) -> list[dict[str, Any]]:
        return self.send(Call("GET", "/api/v1/tokens"))

    def revoke_token(self, name: str, reason: str | None = None, force: bool = False) -> dict[str, Any]:
        """`force`: even the last active admin token, or the one this client uses (refused with 409 otherwise)."""
        return self.send(Call("DELETE", f"/api/v1/tokens/{_seg(name)}", reason=reason,
                              params={"force": "true"} if force else None))


class AsyncControllerClient:
    """Asyncio client for the agent's and the gateway's loops."""

    def __init__(self, base_url: str = DEFAULT_CONTROLLER, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.AsyncBaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(transport=transport, **_client_kwargs(base_url, token, timeout))

    def __repr__(self) -> str:
        return f"AsyncControllerClient({self.base_url!r})"

    async def __aenter__(self) -> "AsyncControllerClient":
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def send(self, call: Call) -> Any:
        try:
            response = await self._http.request(call.method, call.path, json=call.json, params=call.params, headers=call.headers())
        except httpx.HTTPError as exc:
            raise _unreachable(self.base_url, exc) from None
        return _result(response)

    async def register_agent(self, payload: dict[str, Any]) -> dict[str, Any]:
        return await self.send(register_agent_call(payload))

    async def heartbeat(self, payload: dict[str, Any]) -> dict[str, Any]:
        return await self.send(heartbeat_call(payload))

    async def routing(self) -> dict[str, Any]:
        return await self.send(ROUTING)

    async def report_gateway(self, payload: dict[str, Any]) -> dict[str, Any]:
        return await self.send(report_gateway_call(payload))

    async def list_gateways(self) -> list[dict[str, Any]]:
        return await self.send(GATEWAYS)

    async def status(self) -> dict[str, Any]:
        return await self.send(STATUS)

    async def health(self) -> dict[str, Any]:
        return await self.send(HEALTH)


__all__ = ["AsyncControllerClient", "Call", "ControllerClient", "FleetError", "DEFAULT_CONTROLLER"]
