"""The change stream's wire format: what `GET /api/v1/watch` sends, as typed models.

The stream is server-sent events (text/event-stream). Every event has an `id:` (its resume token), an
`event:` name and one `data:` line of JSON:

- `snapshot` (a WatchSnapshot): every watched resource, and the latest events. Always the first event of a
  connection, unless it resumed; also sent when a resume token is unknown or too old to replay from.
- `delta` (a WatchDelta): what changed since the previous event, in order. Applying every delta after the
  snapshot gives what a new snapshot would hold.
- `ping` (a WatchPing): nothing changed for `ping_s`; tells a viewer the stream is alive.

Resuming: a client that reconnects sends the last id it saw as `Last-Event-ID` (or `?resume=`). Its token
is `EPOCH-SEQ`: EPOCH names one controller process's stream, SEQ the event. When the controller still holds
the deltas after SEQ in that epoch it sends them (no snapshot): nothing is missed. Otherwise (another
process, a restart, or a reader so slow that the deltas it needs were dropped) it sends a fresh snapshot.

Resources are the API's own read models, keyed as `key_of` says; a change is shallow: `put` carries the
whole value (a new key), `patch` the top-level fields whose values changed (each whole), `delete` none.
Events (the audit log, canary verdict changes, rollout transitions) are append-only and travel beside the
resources as FleetEventView, in `events`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from fleetctl.controller.contract import GatewayView
from fleetctl.controller.canary_responses import CanaryStreamView
from fleetctl.controller.responses import (
    DrillView,
    EngineView,
    FlagView,
    NodeView,
    ResponseModel,
    TrafficView,
)
from fleetctl.controller.rollout.view import RolloutView

WATCH_PATH = "/api/v1/watch"
SNAPSHOT, DELTA, PING = "snapshot", "delta", "ping"
WatchEventName = Literal["snapshot", "delta", "ping"]

# Every resource kind the stream carries.
WatchKind = Literal["controller", "pulse", "node", "engine", "gateway", "rollout", "canary_stream", "drill",
                    "traffic", "flag"]
WATCH_KINDS: tuple[WatchKind, ...] = ("controller", "pulse", "node", "engine", "gateway", "rollout",
                                      "canary_stream", "drill", "traffic", "flag")
CONTROLLER_KEY = PULSE_KEY = "fleet"  # the one key of the singleton kinds


class ControllerWatchView(ResponseModel):
    """The controller replica that serves the stream."""

    replica: str = Field(description="this replica's name (settings.replica_name, else host:port)")
    leader: bool = Field(description="this replica runs the reconcilers")
    version: str = Field(description="fleetctl version")
    at: str = Field(description="the controller's time when the resource was last built")


class EngineRates(ResponseModel):
    """An engine's recent rates, from the growth of its counters between two readings (None: not known
    yet: one reading so far, or the counters went backwards because the engine restarted)."""

    window_s: float | None = Field(default=None, description="seconds between the two readings")
    tokens_s: float | None = Field(default=None, description="prompt + generation tokens per second")
    prefix_hit_rate: float | None = Field(default=None, description="prefix-cache hits over queries, 0..1")
    ttft_s: float | None = Field(default=None, description="mean time to first token of the requests in the window")
    itl_s: float | None = Field(default=None, description="mean inter-token latency in the window")


class WatchEngineView(EngineView):
    rates: EngineRates = Field(default_factory=EngineRates, description="recent rates from its counters")


class PulseView(ResponseModel):
    """The fleet at a glance, over the last `window_s` (rates from counters; None: not measured yet)."""

    at: str = Field(description="when it was computed")
    window_s: float | None = Field(default=None, description="the window the rates cover")
    requests_s: float | None = Field(default=None, description="user requests per second, all gateways")
    tokens_s: float | None = Field(default=None, description="tokens per second served, all engines")
    ttft_p50_s: float | None = Field(default=None, description="TTFT p50 at the gateways")
    ttft_p90_s: float | None = Field(default=None, description="TTFT p90 at the gateways")
    ttft_engines_s: float | None = Field(default=None, description="mean TTFT at the engines, of every request "
                                         "(the gateways' quantiles count streams only: a non-streamed answer's "
                                         "first token is not seen there)")
    itl_p90_s: float | None = Field(default=None, description="inter-token latency p90 at the gateways")
    rejections_s: float | None = Field(default=None, description="requests the gateways rejected per second")
    prefix_hit_rate: float | None = Field(default=None, description="prefix-cache hits over queries, all engines")
    routing_table_age_s: float | None = Field(default=None, description="the oldest routing table a live "
                                              "gateway routes on, seconds")
    nodes: int = Field(default=0, description="nodes known")
    nodes_up: int = Field(default=0, description="nodes up")
    engines: int = Field(default=0, description="engines known")
    engines_ready: int = Field(default=0, description="engines ready")
    engines_unhealthy: int = Field(default=0, description="engines failed, or on a node that is down")
    drifted: int = Field(default=0, description="running engines whose config differs from their class revision")
    frozen: bool | None = Field(default=None, description="a break-glass freeze holds the fleet (None: not known)")
    pins: dict[str, str] = Field(default_factory=dict, description="model -> the class revision a break-glass "
                                 "pin sends all its traffic to")
    flags: dict[str, Any] = Field(default_factory=dict, description="flag key -> value, every override in force")


class FleetEventView(ResponseModel):
    """One entry of the live event stream."""

    id: str = Field(description="SOURCE:ID, unique and increasing per source")
    at: str = Field(description="when it happened")
    source: Literal["audit", "canary", "rollout"] = Field(description="the audit log, a canary verdict "
                                                          "change, or a rollout transition")
    severity: Literal["info", "warning", "alert"] = Field(description="alert: a canary alarm, a rollout abort, "
                                                          "an API call that failed; warning: refused or paused")
    subject: str = Field(description="what it is about: node, engine, model, rollout id, ...")
    message: str = Field(description="the event in one line")
    actor: str | None = Field(default=None, description="token name (audit events)")


# kind -> the model of its values (the client parses values with these)
WATCH_MODELS: dict[str, type[ResponseModel] | type[Any]] = {
    "controller": ControllerWatchView, "pulse": PulseView, "node": NodeView, "engine": WatchEngineView,
    "gateway": GatewayView, "rollout": RolloutView, "canary_stream": CanaryStreamView, "drill": DrillView,
    "traffic": TrafficView, "flag": FlagView,
}


def key_of(kind: str, value: dict[str, Any], name: str | None = None) -> str:
    """A resource's key within its kind: engines `node/name`, rollouts and drills their id, canary streams
    `model/kind/class_ref/condition` (empty parts for the production stream), traffic its model, flags and
    the rest their name; `name` where the value does not hold its key (flags are stored by name)."""
    if kind in ("controller", "pulse"):
        return CONTROLLER_KEY
    if kind == "engine":
        return f"{value['node']}/{value['name']}"
    if kind in ("rollout", "drill"):
        return str(value["id"])
    if kind == "canary_stream":
        return "/".join(str(value.get(part) or "") for part in ("model", "kind", "class_ref", "condition"))
    if kind == "traffic":
        return str(value["model"])
    if name is not None:
        return name
    return str(value["name"])


class WatchChange(ResponseModel):
    kind: WatchKind
    key: str
    op: Literal["put", "patch", "delete"] = Field(description="put: the whole value (new, or replaced); "
                                                  "patch: the changed top-level fields; delete: gone")
    value: dict[str, Any] | None = Field(default=None, description="put: the value; patch: the fields; delete: None")


class WatchSnapshot(ResponseModel):
    token: str = Field(description="resume token of this event (EPOCH-SEQ)")
    at: str = Field(description="the controller's time")
    ping_s: float = Field(description="a ping follows this long after the last event: a client that hears "
                          "nothing for a few of these is cut off")
    resources: dict[WatchKind, dict[str, dict[str, Any]]] = Field(description="kind -> key -> value")
    events: list[FleetEventView] = Field(default_factory=list, description="the latest events, oldest first")


class WatchDelta(ResponseModel):
    token: str
    at: str
    changes: list[WatchChange] = Field(default_factory=list)
    events: list[FleetEventView] = Field(default_factory=list, description="new events, oldest first")


class WatchPing(ResponseModel):
    token: str = Field(description="the token of the last snapshot or delta (resume from it)")
    at: str


WatchMessage = WatchSnapshot | WatchDelta | WatchPing
