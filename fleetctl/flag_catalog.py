"""The feature flags and kill switches operators can set: each one's name, type, default, scope and effect.
Pure, shared by the controller (which validates and stores overrides), the gateways (which read them from
the routing table) and the CLI.

A flag is addressed by its key: `NAME` for a fleet-wide flag, `NAME:MODEL` for a per-model one. The store
holds overrides only; a flag without one (never set, unset, or its TTL over) has its default, so an
expired override reverts without anyone touching it. `value_of` is how every reader resolves a flag.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fleetctl.replica_class import REF_PATTERN

FlagValue = bool | float | str | None
Scope = Literal["fleet", "model"]
Reader = Literal["gateway", "controller", "agent"]


class FlagError(ValueError):
    """A key or value the catalog does not accept; `field` names what is wrong (`name` or `value`)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class FlagSpec:
    name: str
    kind: type  # bool, float, or str (a class revision NAME@rN)
    default: FlagValue
    scope: Scope
    read_by: Reader  # who applies it: gateways (from the routing table), the controller, or agents (heartbeat)
    summary: str  # what it does when set to a value other than its default (docs/flags.md says more)
    minimum: float | None = None
    maximum: float | None = None
    admin: bool = False  # a break-glass flag: only an admin token may change it (fleetctl breakglass)

    def describe_type(self) -> str:
        if self.kind is bool:
            return "boolean"
        if self.kind is str:
            return "class revision (NAME@rN)"
        return f"number in [{self.minimum:g}, {self.maximum:g}]"


CATALOG: dict[str, FlagSpec] = {spec.name: spec for spec in (
    FlagSpec("prefix_routing", bool, True, "fleet", "gateway",
             "off: gateways rank engines on load alone (no prefix-cache locality bonus)"),
    FlagSpec("admission_control", bool, True, "fleet", "gateway",
             "off: gateways admit every request (no predicted-TTFT rejection)"),
    FlagSpec("pd_disaggregation", bool, True, "model", "gateway",
             "off: the model's requests are served whole by one engine (mixed), never split prefill/decode"),
    FlagSpec("pd_push", bool, True, "fleet", "gateway",
             "off: on the reference engine, decode pulls the prompt's K/V instead of prefill pushing it"),
    FlagSpec("shed_fraction", float, 0.0, "model", "gateway",
             "F > 0: gateways reject that fraction of the model's requests at once with 429 and Retry-After",
             minimum=0.0, maximum=1.0),
    FlagSpec("canary_probes", bool, True, "fleet", "controller",
             "off: no canary probe is sent (the verdicts hold what they had)"),
    FlagSpec("rollout_automation", bool, True, "fleet", "controller",
             "off: rollouts stop advancing and show paused_by: flag; serving continues"),
    FlagSpec("planner", bool, True, "fleet", "controller",
             "off: the P:D planner still recommends, but starts no rebalance in auto mode"),
    FlagSpec("kv_tier_disk", bool, True, "fleet", "agent",
             "off: agents stop writing KV blocks to their disk tiers and reading them back (the blocks stay "
             "until flushed)"),
    FlagSpec("reconciler", bool, True, "fleet", "controller",
             "off: placement stops changing the fleet (no engine started, stopped or drained); serving continues"),
    FlagSpec("freeze", bool, False, "fleet", "controller",
             "on: the reconciler and every rollout stop changing the fleet (rollouts show paused_by: freeze); "
             "serving continues", admin=True),
    FlagSpec("pin", str, None, "model", "gateway",
             "NAME@rN: all of the model's traffic goes to that class revision, over its weights, drills and "
             "rollouts (its rollouts show paused_by: pin)", admin=True),
)}

# Flags a kill switch turns off: the boolean ones that are on unless overridden.
KILL_SWITCHES = tuple(name for name, spec in CATALOG.items() if spec.kind is bool and spec.default is True)

MAX_TTL_S = 30 * 24 * 3600.0  # an override lives at most 30 days before it must be renewed


def key_of(name: str, model: str | None = None) -> str:
    return f"{name}:{model}" if model else name


def parse_key(key: str) -> tuple[FlagSpec, str | None]:
    """(spec, model) of `NAME` or `NAME:MODEL`; FlagError (field `name`) when the catalog has no such flag or
    the scope does not match."""
    name, _, model = key.partition(":")
    spec = CATALOG.get(name)
    if spec is None:
        raise FlagError(f"name: unknown flag {name!r}; known: {', '.join(sorted(CATALOG))}", "name")
    if spec.scope == "model" and not model:
        raise FlagError(f"name: {name} is set per model: {name}:MODEL", "name")
    if spec.scope == "fleet" and model:
        raise FlagError(f"name: {name} is fleet-wide; it takes no model", "name")
    return spec, (model or None)


def coerce(spec: FlagSpec, value: Any) -> FlagValue:
    """`value` as the flag's type; FlagError (field `value`) when it is not one."""
    if spec.kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _WORDS:
            return _WORDS[value.strip().lower()]
        raise FlagError(f"value: {spec.name} is a boolean (true or false), not {value!r}", "value")
    if spec.kind is str:
        if isinstance(value, str) and REF_PATTERN.match(value):
            return value
        raise FlagError(f"value: {spec.name} is a {spec.describe_type()}, not {value!r}", "value")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise FlagError(f"value: {spec.name} is a {spec.describe_type()}, not {value!r}", "value")
    try:
        number = float(value)
    except ValueError:
        raise FlagError(f"value: {spec.name} is a {spec.describe_type()}, not {value!r}", "value") from None
    low = -math.inf if spec.minimum is None else spec.minimum
    high = math.inf if spec.maximum is None else spec.maximum
    if not (low <= number <= high):
        raise FlagError(f"value: {spec.name} is a {spec.describe_type()}, not {value!r}", "value")
    return number


_WORDS = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}


def value_of(overrides: Mapping[str, Any], name: str, model: str | None = None) -> FlagValue:
    """The flag's value: its override in `overrides` (the routing table's flags, or the store's), else its
    default. An override that does not fit the flag's type (written by hand) counts as the default."""
    spec = CATALOG[name]
    raw = overrides.get(key_of(name, model if spec.scope == "model" else None))
    if raw is None:
        return spec.default
    try:
        return coerce(spec, raw)
    except FlagError:
        return spec.default


def pins_of(overrides: Mapping[str, Any]) -> dict[str, str]:
    """model -> the class revision its break-glass pin (`pin:MODEL`) names, for every pin in `overrides`."""
    return {key.partition(":")[2]: value for key, value in overrides.items()
            if key.startswith("pin:") and isinstance(value, str)}


def parse_ttl(text: str) -> float:
    """'30m', '2h', '90s', '1d' or plain seconds -> seconds; ValueError when it is none of those or not in
    (0, MAX_TTL_S]."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    text = text.strip().lower()
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 30m, 2h, 1d)") from None
    if not (0 < seconds <= MAX_TTL_S):
        raise ValueError(f"a TTL is more than 0 and at most {MAX_TTL_S / 86400:g} days, not {text!r}")
    return seconds
