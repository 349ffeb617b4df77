"""Response models of the quality canary's API: streams with their verdicts and evidence, the probes a class
revision served, and verdict changes. The same terms as responses.py: pydantic and the canary's plain types
(`fleetctl/canary/types.py`) only, so the client and the TUI import them without SQLAlchemy.
"""

from __future__ import annotations

from pydantic import Field

from fleetctl.canary.types import Evidence, ProbeKind, Score, Verdict
from fleetctl.controller.responses import ResponseModel


class CanaryStreamView(ResponseModel):
    model: str = Field(description="the served model")
    kind: ProbeKind = Field(description="pinned: one class revision at one batch condition; production: the "
                            "model's production path (a mixture of whatever serves it)")
    class_ref: str | None = Field(description="the class revision (pinned); None for the production stream")
    condition: int | None = Field(description="the batch condition (pinned: 1, 4, 8, 16); None for production")
    batch: str = Field(description="'b1', 'b4', ... or 'mixed'")
    verdict: Verdict = Field(description="healthy | drifting | failing | not_measured")
    since: str | None = Field(description="when the verdict last changed")
    blamed: str | None = Field(description="while alarmed: the class revision (and engine) serving most of "
                               "the bad answers ('class_ref engine' when one engine did)")
    evidence: Evidence | None = Field(description="the tests' statistics against their thresholds and the window's "
                                      "bad probes; None when there is no reference to judge by")


class CanaryProbeView(ResponseModel):
    id: int = Field(description="sequence number, increasing")
    at: str = Field(description="when it was sent")
    model: str = Field(description="the served model")
    kind: ProbeKind = Field(description="pinned | production")
    class_ref: str | None = Field(description="the revision that served it")
    engine: str | None = Field(description="the engine that served it")
    condition: int = Field(description="its batch condition")
    batch_size: int | None = Field(description="the running batch the engine reported; None: not reported")
    prompt_id: str = Field(description="the golden prompt")
    reference_id: int | None = Field(description="the reference it was scored against")
    score: Score | None = Field(description="the score; None when the probe failed")
    error: str | None = Field(description="why the probe failed")


class CanaryClassView(ResponseModel):
    class_ref: str = Field(description="the class revision")
    streams: list[CanaryStreamView] = Field(description="its pinned streams, and its model's production stream")
    probes: list[CanaryProbeView] = Field(description="the latest probes it served, oldest first")


class CanaryEventView(ResponseModel):
    id: int = Field(description="sequence number, increasing")
    at: str = Field(description="when the verdict changed")
    model: str = Field(description="the served model")
    kind: ProbeKind = Field(description="pinned | production")
    class_ref: str | None = Field(description="the class revision (pinned)")
    condition: int | None = Field(description="the batch condition (pinned)")
    batch: str = Field(description="'b1', ... or 'mixed'")
    verdict_from: Verdict = Field(description="the verdict before")
    verdict_to: Verdict = Field(description="the verdict after")
    message: str = Field(description="the change and why, in one line")
    evidence: Evidence | None = Field(description="the evidence when it changed")
