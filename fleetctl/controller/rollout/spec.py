"""A rollout's spec: what an operator writes, validated whole (a bad spec is a 422 naming the field and
nothing is stored).

    model: smollm2-135m
    to: chat@r2                   # B; `from` (A) defaults to the revision holding the model's traffic
    allowCorrectnessChange:       # required when A and B differ in a correctness field
      reason: "KV cache dtype bfloat16, quality gate below"
    replicas: 2                   # B's engines per role (default: as many as A has)
    steps:
      - scale: {}                 # bring up B's engines (surge) before any traffic moves
      - setWeight: 10
      - pause: {duration: 2m}     # timed; `pause: {}` waits for `promote`
      - analysis: {templates: [latency]}
      - setWeight: 50
      - setWeight: 100
    analysis:                     # background analysis, for the whole rollout from `startingStep`
      templates: [errors]
      startingStep: 1
    templates:                    # Argo's AnalysisTemplate vocabulary
      latency:
        metrics:
          - name: ttft
            measure: ttft_p90_s
            successCondition: "result <= 1.2 * baseline"
            interval: 10s
            count: 3
            failureLimit: 0

Conditions are `result OP VALUE` where OP is one of < <= > >= and VALUE is a number, `baseline` or
`NUMBER * baseline` (baseline: the same measure for A over the same window). Durations are `30s`, `2m`,
`1h`, or a bare number of seconds; never negative.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, model_validator

from engine.contract.bounds import FreeText, SafeStr
from fleetctl.replica_class import REF_PATTERN

# What a metric can measure, for requests the gateways served from one class revision in one window.
LATENCY_MEASURES = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "itl_p90_s", "itl_p99_s")
RATE_MEASURES = ("error_rate", "rejection_rate")
QUALITY = "quality"  # the golden-set canary's verdict for B: 1 pass, 0 fail; `not measured` until it measures B
MEASURES = LATENCY_MEASURES + RATE_MEASURES + (QUALITY,)
Measure = Literal[
    "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "itl_p90_s", "itl_p99_s",
    "error_rate", "rejection_rate", "quality",
]

DURATION = re.compile(r"^\s*(?P<value>[0-9]+(\.[0-9]+)?)\s*(?P<unit>s|m|h)?\s*$")
UNIT_S = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_DURATION_S = 7 * 24 * 3600.0
CONDITION = re.compile(
    r"^\s*result\s*(?P<op><=|>=|<|>)\s*(?:(?P<factor>[0-9]+(\.[0-9]+)?)\s*\*\s*)?(?P<rhs>baseline|[0-9]+(\.[0-9]+)?)\s*$")


def parse_duration(value: Any) -> float:
    """'30s' | '2m' | '1h' | a bare number (seconds) -> seconds. Raises ValueError on anything else."""
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 30s, 2m or 1h")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration (30s, 2m, 1h, or seconds; never negative)")
        seconds = float(match["value"]) * UNIT_S[match["unit"]]
    if not 0 <= seconds <= MAX_DURATION_S:
        raise ValueError(f"{value!r}: a duration must be between 0 and 7 days")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


def _ref(value: str) -> str:
    if not REF_PATTERN.match(value):
        raise ValueError(f"{value!r} is not a class revision NAME@rN")
    return value


RevisionRef = Annotated[SafeStr, Field(max_length=80), AfterValidator(_ref)]
TemplateName = Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]


class Condition(BaseModel):
    """`result OP [FACTOR *] (NUMBER | baseline)`, parsed."""

    model_config = ConfigDict(frozen=True)

    op: Literal["<", "<=", ">", ">="]
    factor: float = 1.0
    relative: bool  # compares with `baseline` (A's value over the same window)
    value: float = 0.0  # the absolute threshold when not relative

    @classmethod
    def parse(cls, text: str) -> "Condition":
        match = CONDITION.match(text)
        if not match:
            raise ValueError(f"{text!r}: a condition is 'result OP VALUE' with OP one of < <= > >= and VALUE a "
                             "number, 'baseline' or 'NUMBER * baseline'")
        relative = match["rhs"] == "baseline"
        if not relative and match["factor"] is not None:
            raise ValueError(f"{text!r}: a factor multiplies 'baseline', not a number")
        return cls(op=match["op"], factor=float(match["factor"] or 1.0), relative=relative,
                   value=0.0 if relative else float(match["rhs"]))

    def threshold(self, baseline: float | None) -> float | None:
        """The number `result` is compared with; None when it is relative and A has no value."""
        if not self.relative:
            return self.value
        return None if baseline is None else self.factor * baseline

    def holds(self, result: float, baseline: float | None) -> bool | None:
        limit = self.threshold(baseline)
        if limit is None:
            return None
        return {"<": result < limit, "<=": result <= limit, ">": result > limit, ">=": result >= limit}[self.op]


def _condition(value: str | None) -> str | None:
    if value is not None:
        Condition.parse(value)
    return value


ConditionText = Annotated[str | None, AfterValidator(_condition)]

STRICT = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class MetricSpec(BaseModel):
    """One metric of an analysis template (Argo's AnalysisTemplate metric fields)."""

    model_config = STRICT

    name: TemplateName
    measure: Measure = Field(description="what is measured, for B's requests in the window")
    success_condition: ConditionText = Field(default=None, alias="successCondition")
    failure_condition: ConditionText = Field(default=None, alias="failureCondition")
    interval: Duration | None = Field(default=None, description="between measurements; none: one measurement")
    count: int | None = Field(default=None, ge=0, le=10_000, description="measurements to take (default 1 "
                              "without interval; with one, until the rollout ends for background analysis)")
    initial_delay: Duration = Field(default=0.0, alias="initialDelay")
    failure_limit: int = Field(default=0, ge=-1, le=10_000, alias="failureLimit")
    inconclusive_limit: int = Field(default=0, ge=0, le=10_000, alias="inconclusiveLimit")
    consecutive_error_limit: int = Field(default=4, ge=0, le=10_000, alias="consecutiveErrorLimit")
    min_requests: int = Field(default=20, ge=1, le=10_000_000, alias="minRequests",
                              description="fewer requests from B (or A, for a relative condition) in a window "
                                          "make the measurement inconclusive, never a pass")

    @model_validator(mode="after")
    def _consistent(self) -> "MetricSpec":
        if self.success_condition is None and self.failure_condition is None:
            raise ValueError("successCondition: a metric needs a successCondition or a failureCondition")
        if self.count is not None and self.count > 1 and self.interval is None:
            raise ValueError("interval: count > 1 needs an interval")
        if self.interval is not None and self.interval <= 0:
            raise ValueError("interval: must be positive")
        return self

    def conditions(self) -> tuple[Condition | None, Condition | None]:
        return (Condition.parse(self.success_condition) if self.success_condition else None,
                Condition.parse(self.failure_condition) if self.failure_condition else None)


class AnalysisTemplate(BaseModel):
    model_config = STRICT

    metrics: list[MetricSpec] = Field(min_length=1, max_length=32)

    @model_validator(mode="after")
    def _unique(self) -> "AnalysisTemplate":
        names = [m.name for m in self.metrics]
        if len(set(names)) != len(names):
            raise ValueError("metrics: metric names must be unique within a template")
        return self


class AnalysisRef(BaseModel):
    model_config = STRICT

    templates: list[TemplateName] = Field(min_length=1, max_length=16)


class BackgroundAnalysis(AnalysisRef):
    starting_step: int = Field(default=0, ge=0, le=1000, alias="startingStep")


class Pause(BaseModel):
    model_config = STRICT

    duration: Duration | None = Field(default=None, description="none: wait until promote")


class ScaleStep(BaseModel):
    model_config = STRICT


class SetWeightStep(BaseModel):
    model_config = STRICT

    set_weight: int = Field(alias="setWeight", ge=0, le=100, description="percent of the model's traffic to B")


class PauseStep(BaseModel):
    model_config = STRICT

    pause: Pause


class AnalysisStep(BaseModel):
    model_config = STRICT

    analysis: AnalysisRef


class ScaleUpStep(BaseModel):
    model_config = STRICT

    scale: ScaleStep


STEP_TYPES = ("setWeight", "pause", "analysis", "scale")


def _one_step(value: Any) -> Any:
    """A step is a mapping with exactly one key, one of STEP_TYPES (so the error names the step type)."""
    if isinstance(value, BaseModel):
        return value
    if not isinstance(value, dict) or len(value) != 1:
        raise ValueError(f"a step is a mapping with exactly one of: {', '.join(STEP_TYPES)}")
    (kind,) = value
    if kind not in STEP_TYPES:
        raise ValueError(f"unknown step type {kind!r}: one of {', '.join(STEP_TYPES)}")
    return value


def _kind_of(value: Any) -> str | None:
    if isinstance(value, dict):
        return next(iter(value), None)
    return step_kind(value) if isinstance(value, BaseModel) else None


# Discriminated by the step's one key, so an error names the step type it is about (steps.0.setWeight...).
Step = Annotated[
    Annotated[SetWeightStep, Tag("setWeight")] | Annotated[PauseStep, Tag("pause")]
    | Annotated[AnalysisStep, Tag("analysis")] | Annotated[ScaleUpStep, Tag("scale")],
    Discriminator(_kind_of),
]


class AllowCorrectnessChange(BaseModel):
    model_config = STRICT

    reason: Annotated[FreeText, Field(min_length=1)]


class RolloutSpec(BaseModel):
    """The whole spec. `steps` are checked in order: weights within 0-100 and never decreasing, the last
    setWeight (if any) reaches 100 implicitly (the rollout completes at 100% on B), every template named
    exists."""

    model_config = STRICT

    model: Annotated[SafeStr, Field(min_length=1, max_length=200)]
    to: RevisionRef
    from_: RevisionRef | None = Field(default=None, alias="from", description="default: the revision holding all "
                                                                                "of the model's traffic")
    allow_correctness_change: AllowCorrectnessChange | None = Field(default=None, alias="allowCorrectnessChange")
    replicas: int | None = Field(default=None, ge=1, le=10_000, description="B's engines per role (default: A's)")
    steps: list[Annotated[Step, BeforeValidator(_one_step)]] = Field(min_length=1, max_length=100)
    analysis: BackgroundAnalysis | None = None
    templates: dict[TemplateName, AnalysisTemplate] = Field(default_factory=dict, max_length=32)

    @model_validator(mode="after")
    def _coherent(self) -> "RolloutSpec":
        if self.from_ is not None and self.from_ == self.to:
            raise ValueError("to: the rollout's target is the revision it starts from")
        last = 0
        for index, step in enumerate(self.steps):
            if isinstance(step, SetWeightStep):
                if step.set_weight < last:
                    raise ValueError(f"steps.{index}.setWeight: {step.set_weight} is below the previous weight {last}; "
                                     "weights must not decrease")
                last = step.set_weight
            if isinstance(step, AnalysisStep):
                self._templates_exist(step.analysis.templates, f"steps.{index}.analysis.templates")
        if self.analysis is not None:
            self._templates_exist(self.analysis.templates, "analysis.templates")
            if self.analysis.starting_step >= len(self.steps):
                raise ValueError(f"analysis.startingStep: {self.analysis.starting_step} is past the last step "
                                 f"({len(self.steps) - 1})")
        return self

    def _templates_exist(self, names: list[str], where: str) -> None:
        for name in names:
            if name not in self.templates:
                known = ", ".join(sorted(self.templates)) or "none defined"
                raise ValueError(f"{where}: unknown template {name!r} (templates: {known})")

    def measures(self) -> set[str]:
        """Every measure a template used by this spec names."""
        used = {name for step in self.steps if isinstance(step, AnalysisStep) for name in step.analysis.templates}
        if self.analysis is not None:
            used |= set(self.analysis.templates)
        return {metric.measure for name in used for metric in self.templates[name].metrics}

    def requires_quality(self) -> bool:
        return QUALITY in self.measures()


def step_kind(step: BaseModel) -> str:
    """The step's type as it is written: setWeight | pause | analysis | scale."""
    if isinstance(step, SetWeightStep):
        return "setWeight"
    if isinstance(step, PauseStep):
        return "pause"
    if isinstance(step, AnalysisStep):
        return "analysis"
    return "scale"
