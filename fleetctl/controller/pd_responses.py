"""The P:D API's bodies and answers (shared with the typed client): the rebalance request, a preview, a
rebalance with its flips and history, and a model's P:D status.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from fleetctl.controller.schemas import Body

Count = Annotated[int, Field(ge=0, le=100_000)]


class RebalanceStart(Body):
    prefill: Count = Field(description="prefill engines once the rebalance is done")
    decode: Count = Field(description="decode engines once the rebalance is done")
    mixed: Count | None = Field(default=None, description="mixed engines once done; default: as many as now")
    apply: bool = Field(default=False, description="false: only the preview (nothing stored)")
    floor_prefill: Annotated[int, Field(ge=1, le=1000)] | None = Field(default=None, description="default: the model's")
    floor_decode: Annotated[int, Field(ge=1, le=1000)] | None = Field(default=None, description="default: the model's")
    ttft_slo_s: Annotated[float, Field(gt=0, le=3600)] | None = Field(
        default=None, description="TTFT p90 to keep while flipping; default: the model's")
    itl_slo_s: Annotated[float, Field(gt=0, le=60)] | None = Field(
        default=None, description="ITL p90 to keep while flipping; default: the model's")
    baseline_s: Annotated[float, Field(ge=0, le=3600)] = Field(default=30.0, description="measured before the first flip")


class RatioView(BaseModel):
    prefill: int
    decode: int
    mixed: int


class FlipPreview(BaseModel):
    engine: str
    from_role: str
    to_role: str
    cost: float = Field(description="in-flight requests + 4 x KV cache use (-1 when it is not serving)")


class RebalancePreview(BaseModel):
    model: str
    class_ref: str
    current: RatioView
    target: RatioView
    changes: bool
    flips: list[FlipPreview]
    effect: list[str]


class FlipView(BaseModel):
    engine: str
    from_role: str
    to_role: str
    phase: str = Field(description="draining | starting | done")
    started_at: str
    done_at: str | None
    ttft_p90_s: float | None
    itl_p90_s: float | None


class RebalanceEventView(BaseModel):
    at: str
    actor: str
    event: str
    message: str


class RebalanceView(BaseModel):
    id: int
    model: str
    class_ref: str
    phase: str = Field(description="baseline | flipping | completed | stopped")
    target: RatioView
    paused_by: str | None = Field(description="freeze | rollout while one holds it")
    message: str
    reason: str | None
    created_at: str
    created_by: str
    updated_at: str
    stop_requested: str | None
    slo: dict[str, float]
    baseline: dict[str, float | None]
    flips: list[FlipView]
    version: int
    events: list[RebalanceEventView] = Field(default_factory=list)


class RebalanceStarted(BaseModel):
    preview: RebalancePreview
    rebalance: RebalanceView | None = Field(description="the stored rebalance; null for a preview or no change")


class PdEngineView(BaseModel):
    name: str
    node: str
    role: str
    state: str
    class_ref: str
    draining: bool
    running: int
    waiting: int
    kv_cache_usage: float


class RecommendationView(BaseModel):
    measured: bool = Field(description="false until two readings of the engines' counters 10 s apart exist")
    current: RatioView
    recommended: RatioView
    action: str = Field(description="hold | rebalance")
    changes: bool
    blocked_by: str | None = Field(description="why a recommended change is held back")
    prefill_need: float = Field(description="engines' worth of prefill work, with headroom")
    decode_need: float
    ideal_prefill: float = Field(description="the proportional split before hysteresis and rounding")
    reasons: list[str]


class PdModelView(BaseModel):
    model: str
    class_ref: str | None = Field(description="the one class revision with engines; null while several have")
    class_refs: list[str]
    ratio: RatioView
    mode: str = Field(description="off | advisory | auto")
    settings: dict[str, float]
    profile: dict[str, Any]
    engines: list[PdEngineView]
    recommendation: RecommendationView | None
    rebalance: RebalanceView | None


class PdSettingsSet(Body):
    mode: Literal["off", "advisory", "auto"] | None = None
    floor_prefill: Annotated[int, Field(ge=1, le=1000)] | None = None
    floor_decode: Annotated[int, Field(ge=1, le=1000)] | None = None
    ttft_slo_s: Annotated[float, Field(gt=0, le=3600)] | None = None
    itl_slo_s: Annotated[float, Field(gt=0, le=60)] | None = None
    headroom: Annotated[float, Field(ge=0, le=10)] | None = None
    cooldown_s: Annotated[float, Field(ge=0, le=86_400)] | None = None
    dwell_s: Annotated[float, Field(ge=0, le=3600)] | None = None


class PdProfileSet(Body):
    prefill_tokens_per_s: Annotated[float, Field(gt=0, le=1e9)]
    decode_slots: Annotated[float, Field(gt=0, le=1e6)]
    decode_itl_s: Annotated[float, Field(gt=0, le=60)] | None = Field(
        None, description="the ITL p90 measured at decode_slots; absent: the planner takes the ITL SLO")
    detail: dict[str, Any] = Field(default_factory=dict, description="the sweep's points, as `pd profile` measured them")


class PdProfileView(BaseModel):
    class_ref: str
    prefill_tokens_per_s: float
    decode_slots: float
    decode_itl_s: float | None
    detail: dict[str, Any]
    measured_at: str
    measured_by: str
