"""Response models of the controller API: one pydantic model per response shape, each field described.

The routes declare them (`response_model=`), so the OpenAPI schema documents every response, and the
controller client (the fleetctl.client package) parses replies into them, so the CLI and the TUI read typed values.

Invariants:
- Torch-free and free of the controller's runtime: this module imports only pydantic and the wire types of
  `contract.py` and `engine.contract`, never `models`, `db` or `runtime`, so a client imports it without SQLAlchemy. The quality
  canary's answers are in canary_responses.py, the P:D API's in pd_responses.py, on the same terms.
- A model's fields are the keys its view function builds (views.py, nodes.py, classes.py, ...), in the
  same order, so declaring the model leaves the JSON body as it is. Times are ISO 8601 strings, as sent.
- Models ignore unknown fields, so a client keeps working against a newer controller that adds some; fields
  added later (`version`, `overridden`) have defaults, so it also reads an older controller's replies.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.contract.kv_tier_report import TierReport
from fleetctl.controller.contract import GatewayView, HeartbeatResponse, RegisterResponse, RoutingEngine, RoutingModel, RoutingTable

FlagValue = bool | int | float | str
Changed = Literal["changed", "unchanged"]


class ResponseModel(BaseModel):
    """Base of every response model: unknown fields are ignored; `populate_by_name` for aliased fields."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# --- fleet ---

class Health(ResponseModel):
    ok: bool = Field(description="the controller answers")
    leader: bool = Field(description="this replica runs the reconciler")
    schema_revision: str | None = Field(alias="schema", description="the applied Alembic migration")


class NodeCapacity(ResponseModel):
    engines: int = Field(description="how many engines the node may run")
    kv_mib: int = Field(description="KV memory the node offers, MiB")


class NodeTierView(TierReport):
    """One KV tier of a node, as its agent last reported it; counters are since the agent started."""


class KVFlushView(ResponseModel):
    id: int = Field(description="the flush's number on its node")
    class_name: str | None = Field(default=None, description="the class whose tiers it drops; null: every class's")
    tier: str | None = Field(default=None, description="dram | disk; null: both")
    by: str | None = Field(default=None, description="who asked for it")
    reason: str | None = Field(default=None, description="why")
    at: str | None = Field(default=None, description="when it was asked for")
    dropped: dict[str, int] | None = Field(default=None, description="once done: blocks dropped, by class")
    done_at: str | None = Field(default=None, description="once done: when the controller heard so")


class KVFlushAccepted(ResponseModel):
    node: str = Field(description="the node whose agent carries it out on its next heartbeat")
    flush: KVFlushView = Field(description="the flush asked for (it replaces one not yet carried out)")


class NodeView(ResponseModel):
    name: str = Field(description="the node's name")
    url: str = Field(description="the agent's base URL")
    state: str = Field(description="up | down")
    cordoned: bool = Field(description="no new engines are placed here")
    draining: bool = Field(description="its engines are being drained")
    labels: dict[str, str] = Field(description="labels deployments' placement matches")
    capacity: NodeCapacity = Field(description="what the agent offers")
    agent_version: str = Field(description="the agent's version, as it registered")
    engines: int = Field(description="engines assigned to the node")
    last_heartbeat_at: str = Field(description="time of the last heartbeat (or registration)")
    heartbeat_age_s: float = Field(description="seconds since then, to 0.1 s")
    generation: int = Field(description="the node's desired-assignment generation")
    applied_generation: int = Field(description="the generation the agent last reported applied")
    cut_off_s: float | None = Field(description="seconds the agent was unreachable before its last beat")
    registered_at: str = Field(description="time of first registration")
    kv_tiers: list[NodeTierView] = Field(default_factory=list,
                                         description="its KV tiers, as its agent last reported them")
    kv_flush: KVFlushView | None = Field(default=None, description="a flush of its KV tiers not yet carried out")
    kv_flushed: KVFlushView | None = Field(default=None, description="the last flush of its KV tiers carried out")


class DriftEntry(ResponseModel):
    field: str = Field(description="the class field, engine_args.KEY, or argv.--FLAG for a flag no class field rendered")
    declared: Any = Field(description="what the class revision declares, in the form the backend runs it")
    actual: Any = Field(description="what the engine runs")
    source: Literal["engine", "launch"] = Field(description="engine: the engine's own report; launch: its command line")


class EngineView(ResponseModel):
    name: str = Field(description="engine name, unique on its node")
    node: str = Field(description="the node it is assigned to or runs on")
    deployment: str | None = Field(description="the deployment it belongs to; None if only reported")
    model: str = Field(description="the model it serves")
    class_ref: str = Field(description="its class revision, NAME@rN")
    role: str = Field(description="mixed | prefill | decode")
    state: str = Field(description="starting | ready | draining | stopped | failed, or pending (not yet reported)")
    drain: bool = Field(description="marked for draining")
    cordoned: bool = Field(default=False, description="held out of traffic: running, but gateways route it no new "
                           "request (engine cordon)")
    url: str | None = Field(description="the engine's base URL")
    port: int | None = Field(description="its port")
    pid: int | None = Field(description="its process id")
    kv_events_endpoint: str | None = Field(description="its KV event publisher (ZMQ)")
    restarts: int = Field(description="restarts by the agent's supervisor")
    last_exit: str | None = Field(description="how it last exited")
    metrics: dict[str, Any] = Field(description="the load figures the agent last scraped")
    updated_at: str | None = Field(description="time of the agent's last report; None while pending")
    drift: list[DriftEntry] = Field(default_factory=list, description="how a running engine's config differs "
                                    "from its class revision (live drift); empty when it does not, or is unknown")
    hash_mismatch: bool = Field(default=False, description="a gateway found its KV events hashing prefixes with "
                                "another seed than its own (docs/vllm.md): it gets no prefix routing")
    adopted: bool = Field(default=False, description="an engine fleetctl did not launch, registered by `engine "
                          "adopt`: routed and scraped, never started, stopped or restarted by fleetctl")


class EngineDrift(ResponseModel):
    name: str = Field(description="the engine")
    node: str = Field(description="its node")
    model: str = Field(description="the model it serves")
    class_ref: str = Field(description="the class revision it runs for, NAME@rN")
    state: str = Field(description="starting | ready | draining")
    drifted: bool = Field(description="any difference from the class revision")
    checked: list[Literal["engine", "launch"]] = Field(description="the sources known: engine (its own report), "
                                                        "launch (its command line); empty: nothing to compare")
    drift: list[DriftEntry] = Field(description="every difference, engine-reported first")


class NodeDetail(NodeView):
    engine_list: list[EngineView] = Field(description="the node's engines")


class NodeChange(NodeDetail):
    result: Changed = Field(description="whether the cordon, uncordon or drain changed anything")


class EngineChange(EngineView):
    result: Changed = Field(description="whether the drain, cordon or uncordon changed anything")
    generation: int | None = Field(default=None, description="cordon, uncordon: the routing table generation that "
                                   "includes the change (gateways at or past it have applied it)")


# --- replica classes ---

class ClassRevisionView(ResponseModel):
    name: str = Field(description="the class name")
    revision: int = Field(description="its revision number N")
    ref: str = Field(description="NAME@rN")
    digest: str = Field(description="sha256 of the spec's content")
    spec: dict[str, Any] = Field(description="the ReplicaClassSpec, as stored")
    created_at: str = Field(description="time of creation")
    created_by: str = Field(description="token name that created it")


class ClassApplied(ClassRevisionView):
    result: Literal["created", "unchanged"] = Field(description="a new revision (201), or identical content (200)")


class ClassSummary(ResponseModel):
    name: str = Field(description="the class name")
    latest: str = Field(description="its latest revision, NAME@rN")
    revisions: int = Field(description="how many revisions it has")
    model: str | None = Field(description="the latest revision's model")
    backend: str | None = Field(description="the latest revision's backend")
    created_at: str = Field(description="creation time of the latest revision")


class SpecChange(ResponseModel):
    field: str = Field(description="the spec field; engine_args.FLAG for one engine flag")
    tag: str = Field(description="correctness | performance")
    old: Any = Field(description="its value in the revision before")
    new: Any = Field(description="its value in this revision")


class ClassHistoryEntry(ClassRevisionView):
    changes: list[SpecChange] = Field(description="changes from the revision before, correctness first")


# --- deployments ---

class DeploymentView(ResponseModel):
    name: str = Field(description="the deployment name")
    model: str = Field(description="the model it serves")
    class_ref: str = Field(description="its class revision, NAME@rN")
    role: str = Field(description="mixed | prefill | decode")
    replicas: int = Field(description="desired engines")
    placement: dict[str, str] = Field(description="node labels that must all match")
    updated_at: str = Field(description="time of the last change")
    updated_by: str = Field(description="token name of the last change")
    version: int | None = Field(default=None, description="optimistic-concurrency version (ETag / If-Match); "
                                "None from a controller older than versions")


class DeploymentSetResult(DeploymentView):
    result: Literal["created", "updated", "unchanged"] = Field(description="what the set did")


class DeploymentStatus(DeploymentView):
    placed: int = Field(description="engines assigned and not draining")
    ready: int = Field(description="of those, reported ready")
    pending: int = Field(description="replicas not yet placed")


class DeploymentDeleted(ResponseModel):
    name: str = Field(description="the deleted deployment")
    result: Literal["deleted"] = Field(description="always 'deleted'")


class ControllerInfo(ResponseModel):
    leader: bool = Field(description="this replica runs the reconciler")
    at: str = Field(description="the controller's time of the answer")


class BreakGlassHolds(ResponseModel):
    frozen: bool = Field(default=False, description="a break-glass freeze holds the fleet")
    freeze: FlagView | None = Field(default=None, description="the freeze's override: who, why, until when")
    pins: dict[str, FlagView] = Field(default_factory=dict, description="model -> its pin's override (value: the "
                                      "class revision all its traffic goes to)")


class FleetStatus(ResponseModel):
    controller: ControllerInfo = Field(description="the answering controller")
    nodes: list[NodeView] = Field(description="every node")
    engines: list[EngineView] = Field(description="every assigned or reported engine")
    deployments: list[DeploymentStatus] = Field(description="every deployment, with placement counts")
    drifted: int = Field(default=0, description="running engines whose config differs from their class revision")
    gateways: list[GatewayView] = Field(default_factory=list, description="every gateway that reported, with "
                                        "its routing table's generation and age; empty from an older controller")
    break_glass: BreakGlassHolds | None = Field(default=None, description="the break-glass freeze and pins in "
                                                "force; none from an older controller")


# --- canary drills ---

class DrillView(ResponseModel):
    id: int = Field(description="the drill's id")
    kind: Literal["misroute", "plant"] = Field(description="misroute: a fraction of the traffic elsewhere; "
                                                           "plant: one engine runs with a hidden fault")
    model: str = Field(description="the model drilled")
    to_ref: str | None = Field(description="misroute: the class revision the fraction goes to")
    fraction: float | None = Field(description="misroute: the fraction of the model's traffic sent there")
    engine: str | None = Field(description="plant: the engine restarted with the fault")
    fault: str | None = Field(description="plant: the fault (engine.contract.faults)")
    started_at: str = Field(description="time it started")
    ends_at: str = Field(description="time it ends by itself")
    stopped_at: str | None = Field(description="time it ended; None while in effect")
    stopped_by: str | None = Field(description="token name that stopped it, or 'expired'")
    created_by: str = Field(description="token name that started it")
    active: bool = Field(description="in effect now")
    remaining_s: float | None = Field(description="seconds until it ends by itself, while in effect")
    description: str = Field(description="the drill in one line")


class DrillStarted(DrillView):
    generation: int = Field(description="the routing-table generation that includes it (a misroute reaches "
                                        "gateways at or past it)")


class DrillStopResult(ResponseModel):
    result: Changed = Field(description="changed: drills were ended; unchanged: none was in effect")
    stopped: list[DrillView] = Field(description="the drills this call ended")
    generation: int = Field(description="the routing-table generation without them")


# --- traffic and flags ---

class TrafficPolicyView(ResponseModel):
    weights: dict[str, float] = Field(description="class revision -> relative weight")
    updated_at: str = Field(description="time of the last change")
    updated_by: str = Field(description="token name of the last change")
    version: int | None = Field(default=None, description="optimistic-concurrency version (ETag / If-Match); "
                                "None from a controller older than versions")


class RevisionTraffic(ResponseModel):
    ref: str = Field(description="class revision, NAME@rN")
    weight: float = Field(description="its weight (0 when deployed but not weighted)")
    share: float = Field(description="its share of the positive weights, to 4 places")
    ready_engines: int = Field(description="ready, undrained engines on up nodes")
    correctness: dict[str, Any] = Field(
        description="its correctness-tagged spec fields (engine_args: only its correctness-relevant flags)")


class TrafficView(ResponseModel):
    model: str = Field(description="the model")
    source: Literal["policy", "deployments"] = Field(description="a stored policy, or every deployed revision equally")
    weights: dict[str, float] = Field(description="class revision -> relative weight")
    updated_at: str | None = Field(description="time of the policy's last change; None without a policy")
    updated_by: str | None = Field(description="token name of that change")
    version: int | None = Field(default=None, description="the policy's version; None without a policy")
    revisions: list[RevisionTraffic] = Field(description="each revision weighted or deployed")
    drill: DrillView | None = Field(default=None, description="a misroute drill in effect: gateways route its "
                                    "fraction to its target on top of these weights")


class FieldDifference(ResponseModel):
    field: str = Field(description="the correctness field")
    first: Any = Field(description="its value in the first revision")
    second: Any = Field(description="its value in the second")


class CorrectnessDifferenceView(ResponseModel):
    between: list[str] = Field(description="the two class revisions, lower first")
    fields: list[FieldDifference] = Field(description="the correctness fields that differ")


class TrafficSetResult(ResponseModel):
    model: str = Field(description="the model")
    weights: dict[str, float] = Field(description="the weights asked for")
    result: Changed = Field(description="whether they differ from the stored ones")
    version: int | None = Field(default=None, description="the stored policy's version after the change")
    generation: int = Field(description="the routing-table generation that includes the change")
    correctness_change_allowed: bool = Field(description="stored over differing correctness fields, as allowed")
    correctness_differences: list[CorrectnessDifferenceView] = Field(description="the differences allowed")


class FlagView(ResponseModel):
    name: str | None = Field(default=None, description="the catalog flag (the key without its model)")
    model: str | None = Field(default=None, description="a per-model flag's model")
    value: FlagValue | None = Field(description="the flag's value now: its override in force, else its default")
    default: FlagValue | None = Field(default=None, description="its value without an override")
    overridden: bool = Field(default=True, description="an override is in force (set, not expired)")
    known: bool = Field(default=True, description="a catalog flag; false: a stored key no flag names")
    read_by: str | None = Field(default=None, description="who applies it: gateway, controller or agent")
    summary: str | None = Field(default=None, description="what it does when it is not its default")
    updated_at: str | None = Field(default=None, description="time of the last change of its override")
    updated_by: str | None = Field(default=None, description="the override's owner: token name of its last change")
    reason: str | None = Field(default=None, description="why the override was set")
    expires_at: str | None = Field(default=None, description="when the override expires (its TTL); none: until unset")
    version: int | None = Field(default=None, description="optimistic-concurrency version (ETag / If-Match)")


class FlagSetResult(ResponseModel):
    name: str = Field(description="the flag's key (NAME or NAME:MODEL)")
    value: FlagValue | None = Field(description="its value now")
    result: Changed = Field(description="whether the override changed")
    version: int | None = Field(default=None, description="the override's version after the change")
    expires_at: str | None = Field(default=None, description="when the override expires; none: until unset")
    generation: int | None = Field(default=None, description="the routing generation that includes the change: "
                                   "gateways at or past it apply it")


class DirectDivergence(ResponseModel):
    """A direct (break-glass) action an agent or gateway did without the controller (controller/direct_actions.py)."""
    id: int = Field(description="what `breakglass reconcile --adopt/--revert` names")
    kind: Literal["agent", "gateway"]
    source: str = Field(description="the node or gateway that did it")
    seq: int = Field(description="its line in the node's journal")
    at: str = Field(description="when the node did it")
    action: str = Field(description="drain, stop, restart (agent); flag.set, flag.unset (gateway)")
    target: str = Field(description="the engine, or the flag key")
    value: Any = Field(default=None, description="a flag's local value")
    reason: str | None = None
    desired: Any = Field(default=None, description="what desired state says: the flag's central value, or "
                         "the engine's assignment (run, drain, unassigned)")
    open: bool = Field(description="the node still holds it in force")
    state: Literal["pending", "adopted", "reverted", "matches", "done"]
    resolved_at: str | None = None
    resolved_by: str | None = None
    adopt: str = Field(description="what adopting it does")
    revert: str = Field(description="what reverting it does")


class ReconcileResult(ResponseModel):
    adopted: list[int] = Field(default_factory=list)
    reverted: list[int] = Field(default_factory=list)
    generation: int | None = Field(default=None, description="the routing generation with an adopted flag")


# --- tokens and audit ---

class TokenView(ResponseModel):
    name: str = Field(description="the token's name (the audit log's actor)")
    role: str = Field(description="viewer | operator | admin | agent")
    created_at: str = Field(description="time of creation")
    created_by: str = Field(description="token name that created it")
    revoked_at: str | None = Field(description="time of revocation; None while active")


class WhoAmI(ResponseModel):
    name: str = Field(description="the calling token's name (the audit log's actor)")
    role: str = Field(description="viewer | operator | admin | agent: a viewer token may only read")


class TokenCreated(TokenView):
    token: str = Field(repr=False, description="the secret; shown only in this response")


class TokenRevoked(ResponseModel):
    name: str = Field(description="the token")
    result: Literal["revoked", "unchanged"] = Field(description="revoked now, or it already was")
    overridden: list[str] = Field(default_factory=list, description="guards `force` overrode: last_admin, own_token")


class AuditEventView(ResponseModel):
    id: int = Field(description="sequence number, increasing")
    at: str = Field(description="time of the call")
    actor: str = Field(description="token name")
    action: str = Field(description="the route's name, e.g. deployment.set")
    target: str = Field(description="what it acted on")
    reason: str | None = Field(description="the caller's why")
    payload_digest: str = Field(description="sha256 of the body's canonical JSON")
    result: str = Field(description="ok | noop | refused | error")
    code: str | None = Field(description="error or override code")
    status: int = Field(description="HTTP status of the answer")
    detail: dict[str, Any] | None = Field(description="what a guard explicitly let through")


__all__ = [
    "AuditEventView", "ClassApplied", "ClassHistoryEntry", "ClassRevisionView", "ClassSummary", "ControllerInfo",
    "CorrectnessDifferenceView", "DeploymentDeleted", "DrillStarted", "DrillStopResult", "DrillView", "DriftEntry", "EngineDrift", "DeploymentSetResult", "DeploymentStatus", "DeploymentView",
    "EngineChange", "EngineView", "FieldDifference", "FlagSetResult", "FlagValue", "FlagView", "FleetStatus",
    "GatewayView", "Health", "HeartbeatResponse", "NodeCapacity", "NodeChange", "NodeDetail", "NodeView",
    "RegisterResponse", "ResponseModel", "RevisionTraffic", "RoutingEngine", "RoutingModel", "RoutingTable",
    "SpecChange", "TokenCreated", "TokenRevoked", "TokenView", "TrafficPolicyView", "TrafficSetResult",
    "TrafficView", "WhoAmI",
]
