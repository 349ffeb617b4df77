"""Comparing two replica class specs: the changes field by field, grouped by tag, and a verdict.

A pure function over two specs (`compare`), returning plain data (`ClassDiff`) that the CLI prints as a
table, JSON or YAML and turns into an exit code. The tags come from fleetctl/replica_class.py, engine_args
per flag, so this verdict, `class history` and the traffic-split guard always agree.

Verdicts:
- `identical`: no field differs;
- `outputs unchanged`: only performance fields differ, so the two give the same tokens;
- `outputs may change`: at least one correctness field differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetctl.replica_class import CORRECTNESS, ReplicaClassSpec, diff

IDENTICAL = "identical"
OUTPUTS_UNCHANGED = "outputs unchanged"
OUTPUTS_MAY_CHANGE = "outputs may change"
ARROW = "→"


@dataclass(frozen=True)
class Change:
    field: str  # a spec field, or engine_args.FLAG
    tag: str  # correctness | performance
    old: Any  # its value in A (None: not set)
    new: Any  # its value in B

    def __str__(self) -> str:
        return f"{self.field} {format_value(self.old)} {ARROW} {format_value(self.new)}"

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "tag": self.tag, "old": self.old, "new": self.new}


@dataclass(frozen=True)
class ClassDiff:
    """What differs between A and B, and what that means for the tokens a request gets."""

    a: str  # where A came from: NAME@rN or a file path
    b: str
    correctness: tuple[Change, ...]  # fields that can change tokens, by name
    performance: tuple[Change, ...]  # fields that cannot

    @property
    def verdict(self) -> str:
        if self.correctness:
            return OUTPUTS_MAY_CHANGE
        return OUTPUTS_UNCHANGED if self.performance else IDENTICAL

    @property
    def outputs_may_change(self) -> bool:
        return bool(self.correctness)

    def verdict_line(self) -> str:
        """`outputs may change: kv_cache_dtype float32 → bfloat16`, `outputs unchanged: only performance
        fields differ (max_num_seqs 64 → 128)` or `identical`."""
        if self.correctness:
            return f"{OUTPUTS_MAY_CHANGE}: {_listed(self.correctness)}"
        if self.performance:
            return f"{OUTPUTS_UNCHANGED}: only performance fields differ ({_listed(self.performance)})"
        return IDENTICAL

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a, "b": self.b, "verdict": self.verdict, "summary": self.verdict_line(),
            "correctness": [c.to_json() for c in self.correctness],
            "performance": [c.to_json() for c in self.performance],
        }


def compare(a: str, spec_a: ReplicaClassSpec, b: str, spec_b: ReplicaClassSpec) -> ClassDiff:
    """A against B; `a` and `b` say where each came from."""
    changes = [Change(c["field"], c["tag"], c["old"], c["new"]) for c in diff(spec_a, spec_b)]
    return ClassDiff(
        a=a, b=b,
        correctness=tuple(c for c in changes if c.tag == CORRECTNESS),
        performance=tuple(c for c in changes if c.tag != CORRECTNESS),
    )


def format_value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return str(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _listed(changes: tuple[Change, ...]) -> str:
    return ", ".join(str(c) for c in changes)
