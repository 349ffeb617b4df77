"""Bounded scalar types for every wire model: what a number or a string may hold at a process boundary.

Python integers are unbounded and floats include NaN and infinity, but what a field *means* is not: a PID is
a positive 22-bit number, a port is 1-65535, a counter or generation fits the store's 64-bit signed column.
A value outside its meaning is refused where it enters (a 422 naming the field), never queued, stored or
replicated. Strings are refused when they hold a NUL (PostgreSQL's text type cannot store one) or an
unpaired surrogate (it cannot be encoded as UTF-8, so a driver or a JSON writer fails on it later).

Every contract model (engine, agent, controller, gateway) uses these instead of bare `int`/`float`/`str`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
PID_MAX = 4_194_304  # Linux's PID_MAX_LIMIT (2**22)
# Integer columns are 32-bit on PostgreSQL (`Integer`), so counts stored there are kept below this.
INT32_MAX = 2**31 - 1


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored or encoded, or None when it can."""
    if "\x00" in value:
        return "must not contain a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must not contain an unpaired surrogate"
    return None


def _safe_text(value: str) -> str:
    problem = text_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def find_unsafe_text(value: Any, path: str = "") -> tuple[str, str] | None:
    """The first (dotted path, problem) of a string anywhere in a JSON-like value (keys included)."""
    if isinstance(value, str):
        problem = text_problem(value)
        return (path, problem) if problem else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and (problem := text_problem(key)):
                return (path or where, f"key {problem}")
            found = find_unsafe_text(item, where)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = find_unsafe_text(item, f"{path}.{index}" if path else str(index))
            if found:
                return found
    return None


def _safe_json(value: Any) -> Any:
    found = find_unsafe_text(value)
    if found:
        where, problem = found
        raise ValueError(f"{where}: {problem}" if where else problem)
    return value


# --- integers ---
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX, description="a non-negative 64-bit count, generation or id")]
Count32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
Pid = Annotated[int, Field(ge=1, le=PID_MAX, description="an operating-system process id")]
Port = Annotated[int, Field(ge=1, le=65535, description="a TCP port")]

# --- floats (never NaN or infinite) ---
Finite = Annotated[float, Field(allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False, description="a fraction in 0..1")]
Seconds = Annotated[float, Field(ge=0, le=10 * 365 * 86400, allow_inf_nan=False, description="a duration, seconds")]

# --- strings ---
SafeStr = Annotated[str, AfterValidator(_safe_text)]
ShortText = Annotated[str, Field(max_length=200), AfterValidator(_safe_text)]
Url = Annotated[str, Field(min_length=1, max_length=500), AfterValidator(_safe_text)]
FreeText = Annotated[str, Field(max_length=2000), AfterValidator(_safe_text)]
SafeJson = Annotated[Any, AfterValidator(_safe_json)]
SafeJsonObject = Annotated[dict[str, Any], AfterValidator(_safe_json)]


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


def bounded_text(max_length: int, *, non_blank: bool = False) -> Any:
    """A safe string of at most `max_length` characters (the width of the column that stores it);
    `non_blank` also refuses an empty or all-whitespace one."""
    if non_blank:
        return Annotated[str, Field(min_length=1, max_length=max_length), AfterValidator(_safe_text),
                         AfterValidator(_not_blank)]
    return Annotated[str, Field(max_length=max_length), AfterValidator(_safe_text)]
