"""The call table: agents and gateways, nodes and engines, replica classes, deployments."""

from __future__ import annotations

from typing import Any

from fleetctl.client.endpoint import Request, endpoint, params_of, stream_endpoint
from fleetctl.controller.responses import (
    ClassApplied, ClassHistoryEntry, ClassRevisionView, ClassSummary, DeploymentDeleted, DeploymentSetResult,
    DeploymentView, EngineChange, EngineDrift, EngineView, FleetStatus, GatewayView, Health, HeartbeatResponse,
    KVFlushAccepted, NodeChange, NodeDetail, NodeView, RegisterResponse, RoutingTable, WhoAmI,
)


class FleetCalls:
    """Agents and gateways, nodes and engines, replica classes, deployments."""

    # agents and gateways
    @endpoint("POST", "/api/v1/agents/register", RegisterResponse)
    def register_agent(payload: dict[str, Any]) -> Request:
        return Request(json=payload)

    @endpoint("POST", "/api/v1/agents/heartbeat", HeartbeatResponse)
    def heartbeat(payload: dict[str, Any]) -> Request:
        return Request(json=payload)

    @endpoint("GET", "/api/v1/routing", RoutingTable)
    def routing() -> Request:
        return Request()

    @endpoint("POST", "/api/v1/gateways/report", GatewayView)
    def report_gateway(payload: dict[str, Any]) -> Request:
        """{name, url?, generation, table_age_s, refresh_interval_s?}: the routing table a gateway applied."""
        return Request(json=payload)

    @endpoint("GET", "/api/v1/gateways", list[GatewayView])
    def list_gateways() -> Request:
        """Each gateway's last report: generation, last_seen, seen_ago_s, stale."""
        return Request()

    # fleet
    @endpoint("GET", "/healthz", Health)
    def health() -> Request:
        return Request()

    @endpoint("GET", "/metrics", str)
    def metrics() -> Request:
        """The controller's Prometheus metrics, in the text exposition format."""
        return Request()

    @endpoint("GET", "/api/v1/status", FleetStatus)
    def status() -> Request:
        return Request()

    @stream_endpoint("GET", "/api/v1/watch")
    def watch_stream(resume: str | None = None, silence_s: float | None = None) -> Request:
        """The change stream's SSE lines (parsed by fleetctl.watch_client: use `watch()` or `follow`); from
        `resume` (a token seen) when given. `silence_s`: seconds without a byte that end it (Unavailable)."""
        return Request(params=params_of(resume=resume), timeout_s=silence_s)

    @endpoint("GET", "/api/v1/whoami", WhoAmI)
    def whoami() -> Request:
        """The calling token's name and role."""
        return Request()

    @endpoint("GET", "/api/v1/drift", list[EngineDrift])
    def live_drift(model: str | None = None) -> Request:
        """Each running engine (of `model`) against its class revision: every difference, and its sources."""
        return Request(params=params_of(model=model))

    @endpoint("GET", "/api/v1/nodes", list[NodeView])
    def list_nodes() -> Request:
        return Request()

    @endpoint("GET", "/api/v1/nodes/{name}", NodeDetail)
    def get_node(name: str) -> Request:
        return Request(path={"name": name})

    @endpoint("POST", "/api/v1/nodes/{name}/cordon", NodeChange)
    def cordon_node(name: str, reason: str | None = None) -> Request:
        return Request(path={"name": name}, reason=reason)

    @endpoint("POST", "/api/v1/nodes/{name}/uncordon", NodeChange)
    def uncordon_node(name: str, reason: str | None = None) -> Request:
        return Request(path={"name": name}, reason=reason)

    @endpoint("POST", "/api/v1/nodes/{name}/drain", NodeChange)
    def drain_node(name: str, reason: str | None = None) -> Request:
        return Request(path={"name": name}, reason=reason)

    @endpoint("POST", "/api/v1/nodes/{name}/kv/flush", KVFlushAccepted)
    def flush_node_kv(name: str, class_name: str | None = None, tier: str | None = None,
                      reason: str | None = None) -> Request:
        """Drop the blocks of the node's KV tiers (`class_name`'s, or every class's; `tier`, or both): its agent
        carries it out on its next heartbeat (the node's `kv_flushed` says when)."""
        return Request(path={"name": name}, json={"class_name": class_name, "tier": tier}, reason=reason)

    @endpoint("GET", "/api/v1/engines", list[EngineView])
    def list_engines(node: str | None = None) -> Request:
        return Request(params=params_of(node=node))

    @endpoint("GET", "/api/v1/engines/{name}", EngineView)
    def get_engine(name: str) -> Request:
        return Request(path={"name": name})

    @endpoint("POST", "/api/v1/engines/{name}/drain", EngineChange)
    def drain_engine(name: str, reason: str | None = None) -> Request:
        return Request(path={"name": name}, reason=reason)

    @endpoint("POST", "/api/v1/engines/adopt", EngineView)
    def adopt_engine(url: str, model: str, class_ref: str, role: str = "mixed", kv_events_endpoint: str | None = None,
                     name: str | None = None, reason: str | None = None) -> Request:
        """Bring in an engine fleetctl did not launch; a 422 naming the field when it is refused."""
        body = {"url": url, "model": model, "class_ref": class_ref, "role": role}
        body.update({k: v for k, v in {"kv_events_endpoint": kv_events_endpoint, "name": name}.items() if v})
        return Request(json=body, reason=reason)

    @endpoint("POST", "/api/v1/engines/{name}/release", EngineChange)
    def release_engine(name: str, reason: str | None = None) -> Request:
        """Drain an adopted engine through the gateways, then let it go (no signal is sent to it)."""
        return Request(path={"name": name}, reason=reason)

    @endpoint("POST", "/api/v1/engines/{name}/cordon", EngineChange)
    def cordon_engine(name: str, reason: str | None = None) -> Request:
        """Its `generation`: the routing table generation gateways must reach to have applied it."""
        return Request(path={"name": name}, reason=reason)

    @endpoint("POST", "/api/v1/engines/{name}/uncordon", EngineChange)
    def uncordon_engine(name: str, reason: str | None = None) -> Request:
        return Request(path={"name": name}, reason=reason)

    # replica classes
    @endpoint("POST", "/api/v1/classes", ClassApplied)
    def apply_class(name: str, spec: dict[str, Any], reason: str | None = None) -> Request:
        """The revision; `result` is "created" (201) or "unchanged" (identical content, 200)."""
        return Request(json={"name": name, "spec": spec}, reason=reason)

    @endpoint("GET", "/api/v1/classes/{ref}", ClassRevisionView)
    def get_class(ref: str) -> Request:
        return Request(path={"ref": ref})

    @endpoint("GET", "/api/v1/classes", list[ClassSummary])
    def list_classes() -> Request:
        return Request()

    @endpoint("GET", "/api/v1/classes/{name}/history", list[ClassHistoryEntry])
    def class_history(name: str) -> Request:
        return Request(path={"name": name})

    # deployments
    @endpoint("PUT", "/api/v1/deployments/{name}", DeploymentSetResult)
    def set_deployment(name: str, class_ref: str, replicas: int, role: str = "mixed",
                       placement: dict[str, str] | None = None, model: str | None = None,
                       reason: str | None = None) -> Request:
        body: dict[str, Any] = {"class_ref": class_ref, "replicas": replicas, "role": role, "placement": placement or {}}
        if model is not None:
            body["model"] = model
        return Request(path={"name": name}, json=body, reason=reason)

    @endpoint("GET", "/api/v1/deployments", list[DeploymentView])
    def list_deployments() -> Request:
        return Request()

    @endpoint("GET", "/api/v1/deployments/{name}", DeploymentView)
    def get_deployment(name: str) -> Request:
        return Request(path={"name": name})

    @endpoint("DELETE", "/api/v1/deployments/{name}", DeploymentDeleted)
    def delete_deployment(name: str, reason: str | None = None) -> Request:
        return Request(path={"name": name}, reason=reason)
