"""The traffic-split guard: may a model's traffic be spread over these class revisions? A pure function
over a snapshot (the weights asked for, the specs of the revisions they name, ready engines per revision).

Why: a load-balancing change once sent short requests to long-context servers, 16% of requests at the
worst hour, with availability normal. Routing between classes is a correctness surface, so a split over
revisions whose correctness-tagged fields differ (weights, tokenizer, dtype, KV dtype, context window,
RoPE scaling, sampler, backend, engine version, and each engine_args flag not on the performance-only list,
named `engine_args.FLAG`) is refused unless the caller explicitly allows it (and that is audited).

Refusals, in the order they are reported:
- 422 (the input is invalid): a weight that is negative or not finite (`invalid_weight`); a name that is not
  `NAME@rN` (`validation_failed`); an unknown revision (`unknown_class`); a revision of another model
  (`validation_failed`); no positive weight at all (`validation_failed`, field `weights`).
- 409 (refused by the current state or the guard): a positively weighted revision with no ready engine
  (`no_ready_engines`); two positively weighted revisions that differ in correctness fields
  (`correctness_split_refused`, one refusal per pair, unless `allow_correctness_change`).
A single revision at 100% (all other weights zero) is a cutover, not a split: never a correctness refusal,
though it still needs ready engines. Zero-weight revisions must be valid but need no engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from fleetctl.replica_class import ReplicaClassSpec, diff, parse_ref

INVALID, CONFLICT = 422, 409
INVALID_WEIGHT = "invalid_weight"
VALIDATION_FAILED = "validation_failed"
UNKNOWN_CLASS = "unknown_class"
NO_READY_ENGINES = "no_ready_engines"
CORRECTNESS_SPLIT_REFUSED = "correctness_split_refused"
CORRECTNESS_CHANGE_ALLOWED = "correctness_change_allowed"  # the audit marker of an allowed split


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str  # one line, starting with the field when there is one
    field: str | None
    status: int  # 422 invalid input, 409 refused by the state or the guard


@dataclass(frozen=True)
class FieldChange:
    field: str
    first: Any  # the value in the pair's first revision
    second: Any

    def __str__(self) -> str:
        return f"{self.field} {_value(self.first)} -> {_value(self.second)}"


@dataclass(frozen=True)
class CorrectnessDifference:
    """Two positively weighted revisions whose correctness fields differ."""

    first: str  # class ref, the lower revision of the pair
    second: str
    changes: tuple[FieldChange, ...]

    def describe(self) -> str:
        fields = ", ".join(str(change) for change in self.changes)
        return f"{self.first} and {self.second} differ in correctness fields: {fields}"

    def to_json(self) -> dict[str, Any]:
        return {"between": [self.first, self.second],
                "fields": [{"field": c.field, "first": c.first, "second": c.second} for c in self.changes]}


def check_split(
    model: str,
    weights: Mapping[str, float],
    specs: Mapping[str, ReplicaClassSpec],
    ready_engines: Mapping[str, int],
    allow_correctness_change: bool,
) -> list[Refusal]:
    """Every reason to refuse these weights for `model` (empty: store them). `specs` holds the known
    revisions among those named; `ready_engines` counts ready engines per revision."""
    invalid = [r for ref, weight in weights.items() if (r := _invalid_entry(model, ref, weight, specs)) is not None]
    if invalid:
        return invalid
    positive = positive_refs(weights)
    if not positive:
        return [Refusal(VALIDATION_FAILED, "weights: at least one weight must be positive", "weights", INVALID)]
    refusals = [_no_engines(ref) for ref in positive if ready_engines.get(ref, 0) <= 0]
    if not allow_correctness_change:
        refusals += [_split_refused(d) for d in correctness_differences(weights, specs)]
    return refusals


def correctness_differences(weights: Mapping[str, float], specs: Mapping[str, ReplicaClassSpec]) -> list[CorrectnessDifference]:
    """Each pair of positively weighted (known) revisions whose correctness fields differ."""
    refs = [ref for ref in positive_refs(weights) if ref in specs]
    found = []
    for first, second in combinations(refs, 2):
        changes = tuple(FieldChange(c["field"], c["old"], c["new"])
                        for c in diff(specs[first], specs[second]) if c["tag"] == "correctness")
        if changes:
            found.append(CorrectnessDifference(first, second, changes))
    return found


def positive_refs(weights: Mapping[str, float]) -> list[str]:
    """Refs with a positive weight, in revision order (chat@r2 before chat@r10)."""
    return sorted((ref for ref, w in weights.items() if _finite(w) and w > 0), key=_ref_order)


def _invalid_entry(model: str, ref: str, weight: float, specs: Mapping[str, ReplicaClassSpec]) -> Refusal | None:
    field = f"weights.{ref}"
    if not _finite(weight) or weight < 0:
        return Refusal(INVALID_WEIGHT, f"{field}: must be a finite number >= 0, not {weight!r}", field, INVALID)
    try:
        parse_ref(ref)
    except ValueError as exc:
        return Refusal(VALIDATION_FAILED, f"{field}: {exc}", field, INVALID)
    spec = specs.get(ref)
    if spec is None:
        return Refusal(UNKNOWN_CLASS, f"{field}: unknown replica class {ref!r}", field, INVALID)
    if spec.model != model:
        return Refusal(VALIDATION_FAILED, f"{field}: serves {spec.model!r}, not {model!r}", field, INVALID)
    return None


def _no_engines(ref: str) -> Refusal:
    message = (f"weights.{ref}: no ready engine serves {ref}; deploy it and wait until an engine is ready "
               "before giving it traffic")
    return Refusal(NO_READY_ENGINES, message, f"weights.{ref}", CONFLICT)


def _split_refused(difference: CorrectnessDifference) -> Refusal:
    message = f"{difference.describe()}; pass allow_correctness_change to split traffic anyway"
    return Refusal(CORRECTNESS_SPLIT_REFUSED, message, f"weights.{difference.second}", CONFLICT)


def _finite(weight: float) -> bool:
    return isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight)


def _ref_order(ref: str) -> tuple[str, int, str]:
    try:
        name, revision = parse_ref(ref)
    except ValueError:
        return (ref, 0, ref)
    return (name, revision, ref)


def _value(value: Any) -> str:
    return "none" if value is None else str(value)
