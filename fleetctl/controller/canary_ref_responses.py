"""Response models of the canary's golden sets and recorded references (routes_canary_refs.py); the same
invariants as responses.py, whose base model and `Changed` they use."""

from __future__ import annotations

from pydantic import Field

from fleetctl.controller.responses import Changed, ResponseModel


class GoldenSetSummary(ResponseModel):
    name: str = Field(description="the golden set's name")
    version: int = Field(description="its version; a changed set is a new version")
    model: str = Field(description="the served model name its prompts are for")
    digest: str = Field(description="sha256 of the set's canonical JSON")
    description: str = Field(default="", description="what the set holds")
    prompts: int = Field(description="how many prompts")
    created_at: str = Field(description="when it was stored")
    created_by: str = Field(description="token name that stored it")


class GoldenSetStored(GoldenSetSummary):
    result: Changed = Field(description="changed: stored now; unchanged: the identical set was already stored")


class ConditionNoiseTotal(ResponseModel):
    runs: int = Field(description="recording runs at this batch condition, over all prompts")
    diverged: int = Field(description="of them, runs whose tokens differ from the reference")
    max_distance: float = Field(description="the largest top-k distance to the reference over the matching prefix")


class ReferenceSummary(ResponseModel):
    id: int = Field(description="the reference's id")
    model: str = Field(description="the served model name")
    class_ref: str = Field(description="the class revision it was recorded from, NAME@rN")
    golden_set: str = Field(description="the golden set's name")
    golden_version: int = Field(description="the golden set's version")
    correctness_digest: str = Field(description="digest of that revision's correctness fields: revisions with the "
                                    "same one are compared with it exactly")
    recorded_at: str = Field(description="when it was stored")
    recorded_by: str = Field(description="token name that stored it")
    prompts: int = Field(description="prompts answered")
    noise: dict[int, ConditionNoiseTotal] = Field(description="batch condition -> the class's own noise, summed over prompts")
    expected_passed: int = Field(description="expected answers the reference itself passed")
    expected_failed: int = Field(description="expected answers it failed (those prompts are left out of the answer test)")
