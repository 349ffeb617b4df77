"""What the rollout machine works on: the persisted state, the observations of one reconcile, the actions it
emits, and the per-revision gateway counters analysis is measured from. Plain frozen data; the store keeps
`RolloutState` as JSON (`to_json` / `from_json`), so a restarted or newly elected controller continues
from exactly what the last one stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Literal

# --- phases (Argo's status.phase, in fleetctl's words) ---
PROGRESSING = "progressing"  # working through the steps
PAUSED = "paused"  # waiting: a pause step, an inconclusive analysis, an operator, or a freeze
COMPLETED = "completed"  # all traffic on B, acknowledged; A drained (terminal)
ABORTED = "aborted"  # all traffic back on A, acknowledged; B drained; `retry` starts the steps again
ABORTING = "aborting"  # abort decided; traffic is moving back to A and not yet acknowledged everywhere
Phase = Literal["progressing", "paused", "completed", "aborted", "aborting"]
TERMINAL = (COMPLETED, ABORTED)

# --- why a rollout is paused (Argo's pause condition reasons, plus fleetctl's own) ---
PAUSE_STEP = "CanaryPauseStep"  # a `pause` step (timed or indefinite)
INCONCLUSIVE = "InconclusiveAnalysisRun"  # an analysis could not decide; promote or abort
BY_OPERATOR = "PausedByOperator"  # `fleetctl rollout pause`
DRIFT = "EngineConfigDrift"  # a step would send traffic to an engine that does not run its declared class
FROZEN = "BreakGlassFreeze"  # the fleet is frozen (break-glass); `paused_by` is FREEZE
PINNED = "BreakGlassPin"  # the model is pinned to one class revision (break-glass); `paused_by` is PIN
PauseReason = Literal["CanaryPauseStep", "InconclusiveAnalysisRun", "PausedByOperator", "EngineConfigDrift",
                      "BreakGlassFreeze", "BreakGlassPin"]
FREEZE = "freeze"  # `paused_by` while a break-glass freeze holds the rollout
PIN = "pin"  # `paused_by` while a break-glass pin of its model holds the rollout
BREAK_GLASS = (FREEZE, PIN)  # holds that lift by themselves (not by resume/promote)
HOLD_REASONS = {FREEZE: FROZEN, PIN: PINNED}

# --- analysis phases (Argo's lattice: a run's phase is its worst metric's) ---
PENDING, RUNNING, SUCCESSFUL, FAILED, ERROR, INCONCLUSIVE_PHASE = (
    "Pending", "Running", "Successful", "Failed", "Error", "Inconclusive")
PHASE_ORDER = (SUCCESSFUL, RUNNING, PENDING, INCONCLUSIVE_PHASE, ERROR, FAILED)  # best to worst


@dataclass(frozen=True)
class Histogram:
    """Cumulative Prometheus-style buckets: `counts[i]` observations <= `bounds[i]`; `count` in all (the
    +Inf bucket). Bounds are the same for every revision and gateway (vLLM's bucket families)."""

    bounds: tuple[float, ...] = ()
    counts: tuple[int, ...] = ()
    count: int = 0
    sum: float = 0.0


@dataclass(frozen=True)
class ServedCounters:
    """What one gateway served from one class revision since it started: cumulative, like Prometheus
    counters (a gateway restart resets them; window math treats a decrease as a reset)."""

    requests: int = 0  # answered, whatever the status
    errors: int = 0  # 5xx answers and streams cut after the first token
    rejections: int = 0  # 429s: admission control or rate limits
    ttft: Histogram = field(default_factory=Histogram)  # seconds, arrival to first token
    itl: Histogram = field(default_factory=Histogram)  # seconds, mean inter-token latency per request


# gateway name -> class_ref -> counters
ServedByGateway = Mapping[str, Mapping[str, ServedCounters]]


@dataclass(frozen=True)
class Measurement:
    """One measurement of one metric (kept, newest last, up to a retention limit)."""

    at: datetime
    phase: str  # Successful | Failed | Inconclusive | Error
    value: float | None  # B's value (None: not measured)
    baseline: float | None  # A's value over the same window, for relative conditions
    threshold: float | None  # what `value` was compared with
    requests: int  # B's requests in the window
    message: str = ""  # why, in one line: "p90 TTFT 0.41 s <= 1.2 x 0.38 s", "12 requests < minRequests 20"


@dataclass(frozen=True)
class MetricRun:
    """One metric's progress within an analysis run (Argo's MetricResult counters)."""

    name: str
    template: str
    phase: str = PENDING
    count: int = 0
    successful: int = 0
    failed: int = 0
    inconclusive: int = 0
    error: int = 0
    consecutive_error: int = 0
    next_at: datetime | None = None  # when the next measurement is due
    window_start: ServedByGateway | None = None  # counters at the start of the current window
    window_started_at: datetime | None = None
    measurements: tuple[Measurement, ...] = ()


@dataclass(frozen=True)
class AnalysisRun:
    """An inline (step) or background analysis: its metrics and its phase, the worst of theirs."""

    kind: Literal["step", "background"]
    step_index: int | None  # the step that started it (inline), or the starting step (background)
    started_at: datetime
    phase: str = RUNNING
    metrics: tuple[MetricRun, ...] = ()
    message: str = ""


@dataclass(frozen=True)
class RolloutState:
    """Everything a rollout needs between reconciles. `step_index == len(spec.steps)` means every step is
    done and the rollout is finishing (weights to 100% on B, then A drained)."""

    phase: Phase = PROGRESSING
    step_index: int = 0
    step_started_at: datetime | None = None  # when the current step began (a timed pause counts from here)
    pause_reason: PauseReason | None = None
    paused_by: str | None = None  # who paused: an operator's token name, or "freeze" (break-glass)
    abort_reason: str | None = None
    promote_full: bool = False
    weight: int = 0  # B's percent the last setWeight asked for (what the stored traffic policy should say)
    step_analysis: AnalysisRun | None = None
    background: AnalysisRun | None = None
    message: str = ""  # the latest thing worth telling the operator
    updated_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return _encode(asdict(self))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RolloutState":
        return _decode_state(data)

    def but(self, **changes: Any) -> "RolloutState":
        return replace(self, **changes)


@dataclass(frozen=True)
class Observations:
    """What one reconcile sees of the fleet, read by the controller before the machine runs."""

    weights: Mapping[str, float]  # the model's stored traffic policy: class_ref -> weight
    acknowledged: bool  # every live gateway applied a routing table that has `weights`
    ready: Mapping[str, int]  # class_ref -> ready, routable, not draining engines, per role summed
    desired: Mapping[str, int]  # class_ref -> engines its deployments ask for (all roles)
    drifted: Mapping[str, tuple[str, ...]]  # class_ref -> engines whose running config differs from the class
    served: ServedByGateway  # cumulative counters, per gateway and class revision
    quality: Mapping[str, str | None]  # class_ref -> canary verdict "pass" | "fail", None: not measured
    frozen: bool = False  # break-glass freeze: every rollout pauses
    pinned: bool = False  # break-glass pin of the model: its rollouts pause (gateways ignore the weights)


# --- actions: idempotent, applied by the reconciler in order ---

@dataclass(frozen=True)
class SetWeights:
    """Store the model's traffic policy (A and B only); allowed to split correctness-different revisions
    when the spec said so."""

    weights: Mapping[str, float]
    allow_correctness_change: bool


@dataclass(frozen=True)
class ScaleUp:
    """Ensure B's deployments exist with `replicas` per role (one deployment per role A has)."""

    class_ref: str
    replicas: int


@dataclass(frozen=True)
class Drain:
    """Scale a revision's rollout-managed deployments to zero: its engines drain (never killed)."""

    class_ref: str


@dataclass(frozen=True)
class Record:
    """An event in the rollout's history (and the audit log): step started/finished, analysis outcome,
    pause, abort, completion."""

    event: str
    message: str
    step: int | None = None  # the step it is about (step_started, step_done, analysis)


Action = SetWeights | ScaleUp | Drain | Record


@dataclass(frozen=True)
class Transition:
    state: RolloutState
    actions: tuple[Action, ...] = ()
    requeue_after_s: float | None = None  # when the machine next needs to look (a pause ending, a measurement)


# --- JSON codec for RolloutState (datetimes as ISO strings, tuples as lists) ---

def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"$dt": value.isoformat()}
    if isinstance(value, Mapping):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$dt"}:
            return datetime.fromisoformat(value["$dt"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _histogram(data: Mapping[str, Any]) -> Histogram:
    return Histogram(tuple(data["bounds"]), tuple(data["counts"]), data["count"], data["sum"])


def _counters(data: Mapping[str, Any]) -> ServedCounters:
    return ServedCounters(data["requests"], data["errors"], data["rejections"], _histogram(data["ttft"]),
                          _histogram(data["itl"]))


def encode_json(value: Any) -> Any:
    """Plain data (dataclasses already `asdict`-ed) as JSON the store keeps: datetimes tagged, tuples as lists."""
    return _encode(value)


def decode_json(value: Any) -> Any:
    return _decode(value)


def served_from_json(data: Mapping[str, Any] | None) -> ServedByGateway | None:
    """Per-gateway counters as `to_json` stored them (other machines keep counter windows too)."""
    return _served(data)


def _served(data: Mapping[str, Any] | None) -> ServedByGateway | None:
    if data is None:
        return None
    return {gw: {ref: _counters(c) for ref, c in refs.items()} for gw, refs in data.items()}


def _metric_run(data: Mapping[str, Any]) -> MetricRun:
    values = dict(data)
    values["window_start"] = _served(values.get("window_start"))
    values["measurements"] = tuple(Measurement(**m) for m in values.get("measurements", ()))
    return MetricRun(**values)


def _analysis(data: Mapping[str, Any] | None) -> AnalysisRun | None:
    if data is None:
        return None
    values = dict(data)
    values["metrics"] = tuple(_metric_run(m) for m in values.get("metrics", ()))
    return AnalysisRun(**values)


def _decode_state(data: Mapping[str, Any]) -> RolloutState:
    values = _decode(dict(data))
    known = {f.name for f in fields(RolloutState)}
    values = {k: v for k, v in values.items() if k in known}
    values["step_analysis"] = _analysis(values.get("step_analysis"))
    values["background"] = _analysis(values.get("background"))
    return RolloutState(**values)
