"""What the rebalance machine works on: its spec, the persisted state, one reconcile's observations and the
actions it emits. Plain frozen data; the store keeps `RebalanceState` as JSON, so a restarted controller
continues the rebalance from the flip it was in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Literal

from fleetctl.controller.rollout.state import ServedByGateway, decode_json, encode_json, served_from_json
from fleetctl.pd.flips import EngineNow
from fleetctl.pd.planner import Ratio

# --- phases ---
BASELINE = "baseline"  # measuring TTFT and ITL before the first flip
FLIPPING = "flipping"  # one flip after another
COMPLETED = "completed"  # the target ratio is reached (terminal)
STOPPED = "stopped"  # stopped by itself (an SLO worsened) or by an operator, after a whole flip (terminal)
Phase = Literal["baseline", "flipping", "completed", "stopped"]
TERMINAL = (COMPLETED, STOPPED)

# --- what holds a rebalance (it resumes by itself when the hold lifts) ---
FREEZE = "freeze"
ROLLOUT = "rollout"

# --- a flip's phases ---
DRAINING = "draining"  # the engine is draining out of its old role: in-flight requests and handoffs finish
STARTING = "starting"  # a new engine of the same class revision is starting in the new role
DONE = "done"


@dataclass(frozen=True)
class RebalanceSpec:
    model: str
    class_ref: str
    target: Ratio
    ttft_slo_s: float = 2.0  # TTFT p90 the model should keep while the rebalance runs
    itl_slo_s: float = 0.1  # ITL p90
    baseline_s: float = 30.0  # measured before the first flip: what "worsens" is compared with
    min_requests: int = 10  # fewer in a flip's window: the SLO is not judged for that flip
    tolerance: float = 0.2  # worse = over the SLO and more than this fraction over the baseline

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RebalanceSpec":
        values = dict(data)
        values["target"] = Ratio(**values["target"])
        return cls(**values)


@dataclass(frozen=True)
class FlipState:
    engine: str  # the engine leaving its role
    deployment: str  # the deployment it leaves
    from_role: str
    to_role: str
    phase: str  # draining | starting | done
    from_replicas: int  # `deployment`'s replicas without the engine
    started_at: datetime
    window_start: ServedByGateway  # the model's counters when the flip began: its SLO window
    to_replicas: int | None = None  # the new role's replicas once the new engine is asked for
    drained_at: datetime | None = None
    done_at: datetime | None = None
    ttft_p90_s: float | None = None  # over the flip's window, when judged
    itl_p90_s: float | None = None


@dataclass(frozen=True)
class RebalanceState:
    phase: Phase = BASELINE
    paused_by: str | None = None  # freeze | rollout, while one holds it
    baseline_start: ServedByGateway | None = None
    baseline_started_at: datetime | None = None
    baseline_ttft_p90_s: float | None = None
    baseline_itl_p90_s: float | None = None
    flips: tuple[FlipState, ...] = ()
    stop_requested: str | None = None  # an operator's `pd stop`: who, stops after the flip in progress
    message: str = ""
    updated_at: datetime | None = None

    @property
    def current_flip(self) -> FlipState | None:
        return self.flips[-1] if self.flips and self.flips[-1].phase != DONE else None

    def but(self, **changes: Any) -> "RebalanceState":
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return encode_json(asdict(self))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RebalanceState":
        values = decode_json(dict(data))
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in values.items() if k in known}
        values["baseline_start"] = served_from_json(values.get("baseline_start"))
        values["flips"] = tuple(
            FlipState(**{**f, "window_start": served_from_json(f["window_start"]) or {}})
            for f in values.get("flips", ()))
        return cls(**values)


@dataclass(frozen=True)
class Observations:
    """The revision being rebalanced, as one reconcile reads it."""

    engines: tuple[EngineNow, ...]  # its engines that are not draining (serving or starting)
    running: frozenset[str]  # names of its engines that still have an assignment (draining ones included)
    drained: frozenset[str]  # names whose assignment is marked drain
    desired: Ratio  # what its deployments ask for, per role
    ready: Ratio  # ready, routable, undrained engines, per role
    replicas: Mapping[str, int]  # its deployments' replicas, by deployment name
    acknowledged: bool  # every live gateway routes on the current table
    served: ServedByGateway  # the model's counters per gateway (only this revision's are read)
    frozen: bool = False
    rollout: str | None = None  # a running rollout of the model, in words


# --- actions: idempotent, applied by the reconciler in order ---

@dataclass(frozen=True)
class DrainEngine:
    """Mark the engine's assignment drained and set its deployment to `replicas` (one fewer), in one write,
    so placement drains it and does not replace it."""

    engine: str
    deployment: str
    replicas: int


@dataclass(frozen=True)
class ScaleRole:
    """Set the revision's deployment in `role` to `replicas`; if it has none, create one with
    `like_deployment`'s placement."""

    role: str
    replicas: int
    like_deployment: str


@dataclass(frozen=True)
class Record:
    event: str
    message: str


Action = DrainEngine | ScaleRole | Record


@dataclass(frozen=True)
class Transition:
    state: RebalanceState
    actions: tuple[Action, ...] = ()
    requeue_after_s: float | None = None


@dataclass(frozen=True)
class FlipJudgement:
    """A finished flip's latency against the SLO and the baseline."""

    worse: bool
    ttft_p90_s: float | None
    itl_p90_s: float | None
    message: str = field(default="")
