"""A check's comparison: does `actual` (from the JSON) stand in relation `op` to `expected` (from the runbook)?

An expected string that came from a `{var}` is read as YAML when the actual value is not a string, so
`expect: "{replicas}"` with `--var replicas=2` compares 2 with 2, not "2" with 2.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

DESCRIPTION = {"eq": "==", "ne": "!=", "gt": ">", "gte": ">=", "lt": "<", "lte": "<=", "in": "in", "not_in": "not in",
               "contains": "contains", "not_contains": "does not contain"}


def coerce(expected: Any, actual: Any) -> Any:
    if isinstance(expected, str) and not isinstance(actual, str):
        try:
            return yaml.safe_load(expected)
        except yaml.YAMLError:
            return expected
    return expected


def holds(op: str, actual: Any, expected: Any) -> bool:
    """Whether it holds; False where the values cannot be compared (a string and a number for `gt`)."""
    try:
        return _holds(op, actual, coerce(expected, actual))
    except TypeError:
        return False


def _holds(op: str, actual: Any, expected: Any) -> bool:
    if op == "eq":
        return actual == expected
    if op == "ne":
        return actual != expected
    if op in ("gt", "gte", "lt", "lte"):
        if isinstance(actual, bool) or not isinstance(actual, (int, float)):
            raise TypeError(op)
        return {"gt": actual > expected, "gte": actual >= expected, "lt": actual < expected,
                "lte": actual <= expected}[op]
    if op in ("in", "not_in"):
        inside = actual in (expected if isinstance(expected, (list, str, dict)) else [expected])
        return inside if op == "in" else not inside
    if op in ("contains", "not_contains"):
        if not isinstance(actual, (list, str, dict)):
            raise TypeError(op)
        inside = expected in actual
        return inside if op == "contains" else not inside
    raise ValueError(f"unknown op {op!r}")


def shown(value: Any) -> str:
    return json.dumps(value, default=str) if not isinstance(value, str) else value


def describe(op: str, actual: Any, expected: Any) -> str:
    return f"got {shown(actual)}, want {DESCRIPTION[op]} {shown(expected)}"
