"""What the API answers about a rollout (`GET /api/v1/rollouts/{id}`), and what `fleetctl rollout status`
and `watch` draw: plain response models, built by fleetctl.controller.rollouts from the stored spec and
state and the fleet's current weights."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class StepView(BaseModel):
    index: int
    kind: str  # setWeight | pause | analysis | scale
    text: str  # "setWeight 10", "pause 2m", "pause (until promote)", "analysis latency", "scale 2 engine(s)"
    status: str  # done | current | pending | skipped (promoted past it) | not_run (aborted before it)


class MeasurementView(BaseModel):
    at: str
    phase: str  # Successful | Failed | Inconclusive | Error
    value: float | None
    baseline: float | None
    threshold: float | None
    requests: int
    message: str


class GateView(BaseModel):
    """One metric of an analysis run, with its latest measurement."""

    analysis: str  # "step" | "background"
    template: str
    metric: str
    measure: str  # ttft_p90_s, error_rate, quality, ...
    condition: str  # the successCondition (or failureCondition) as written
    phase: str  # Pending | Running | Successful | Failed | Error | Inconclusive
    count: int
    successful: int
    failed: int
    inconclusive: int
    error: int
    failure_limit: int
    latest: MeasurementView | None = None
    next_in_s: float | None = None  # seconds until the next measurement


class RolloutView(BaseModel):
    id: int
    model: str
    from_ref: str = Field(description="A: the revision the rollout moves traffic from")
    to_ref: str = Field(description="B: the revision it moves traffic to")
    phase: str  # progressing | paused | aborting | aborted | completed
    step_index: int
    steps: list[StepView]
    weight: int = Field(description="B's percent the rollout asks for")
    weights: dict[str, float] = Field(description="the model's stored traffic policy now")
    acknowledged: bool = Field(description="every live gateway routes on `weights`")
    ready: dict[str, int] = Field(description="ready engines per revision (A and B)")
    desired: dict[str, int] = Field(description="engines asked for per revision (A and B)")
    drifted: dict[str, list[str]] = Field(default_factory=dict, description="revision -> drifted engines")
    pause_reason: str | None = None
    paused_by: str | None = None
    pause_left_s: float | None = Field(default=None, description="seconds left in a timed pause")
    pause_ends_at: str | None = Field(default=None, description="when a timed pause ends (a client counts down "
                                      "to it: pause_left_s is as of when the view was built)")
    abort_reason: str | None = None
    message: str = ""
    gates: list[GateView] = Field(default_factory=list)
    progress: float = Field(description="0..1: steps done over steps")
    allow_correctness_change: str | None = Field(default=None, description="the reason given, when allowed")
    created_at: str
    created_by: str
    updated_at: str
    version: int
    spec: dict[str, Any] = Field(description="the spec as stored (aliases as written)")


class RolloutEventView(BaseModel):
    id: int
    rollout_id: int
    at: str
    actor: str  # an operator's token name, or "controller"
    event: str  # started, step, weights, analysis, paused, resumed, promoted, aborted, completed, retried, ...
    message: str
