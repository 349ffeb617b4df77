"""What changed between two builds of the watched resources, as the change stream's shallow changes (pure).

Per (kind, key): a key only in the new build is a `put` (the whole value), one only in the old a `delete`,
one in both whose value changed a `patch` carrying the top-level fields whose values differ, each whole.

Some fields move with the clock alone: ages and countdowns computed at build time (a node's
`heartbeat_age_s`, a gateway's `seen_ago_s`, a drill's `remaining_s`, a rollout's `pause_left_s` and its
gates' `next_in_s`) and the build times of the singletons (`at`, the pulse's `window_s`). A value whose only
differences are in those is not a change: the published value stays the one built before, so a quiet fleet
sends pings, not a delta a second per node. Such fields are refreshed whenever something else of the value
changes; a client computes a live age from the timestamps (`last_heartbeat_at`, `last_seen`, `ends_at`)
and the time of the last message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Resources = Mapping[str, Mapping[str, Mapping[str, Any]]]
Change = dict[str, Any]  # watch_contract.WatchChange as JSON

CLOCK_FIELDS: dict[str, frozenset[str]] = {
    "controller": frozenset({"at"}),
    "pulse": frozenset({"at", "window_s"}),
    "node": frozenset({"heartbeat_age_s"}),
    "gateway": frozenset({"seen_ago_s"}),
    "drill": frozenset({"remaining_s"}),
    "rollout": frozenset({"pause_left_s"}),
}
NESTED_CLOCK_FIELDS: dict[str, tuple[str, frozenset[str]]] = {
    "rollout": ("gates", frozenset({"next_in_s"})),  # field -> the clock fields of each item of its list
}


def diff(old: Resources, new: Resources) -> tuple[dict[str, dict[str, Mapping[str, Any]]], list[Change]]:
    """(the resources to publish, the changes from `old` to them), kinds and keys in the order of `new`.
    A value that changed only with the clock is published as it was in `old`."""
    published: dict[str, dict[str, Mapping[str, Any]]] = {}
    changes: list[Change] = []
    for kind, values in new.items():
        before = old.get(kind, {})
        kept: dict[str, Mapping[str, Any]] = {}
        for key, value in values.items():
            previous = before.get(key)
            if previous is None:
                changes.append({"kind": kind, "key": key, "op": "put", "value": dict(value)})
                kept[key] = value
            elif same_but_for_the_clock(kind, previous, value):
                kept[key] = previous
            else:
                changes.append({"kind": kind, "key": key, "op": "patch", "value": changed_fields(previous, value)})
                kept[key] = value
        changes.extend({"kind": kind, "key": key, "op": "delete", "value": None} for key in before if key not in values)
        published[kind] = kept
    for kind, values in old.items():  # a kind the new build lacks altogether
        if kind not in new:
            changes.extend({"kind": kind, "key": key, "op": "delete", "value": None} for key in values)
    return published, changes


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level fields of `new` whose values differ from `old`'s (a field gone from `new` is None)."""
    fields = {name: value for name, value in new.items() if name not in old or old[name] != value}
    fields.update({name: None for name in old if name not in new})
    return fields


def same_but_for_the_clock(kind: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return old == new or without_clock(kind, old) == without_clock(kind, new)


def without_clock(kind: str, value: Mapping[str, Any]) -> dict[str, Any]:
    clock = CLOCK_FIELDS.get(kind, frozenset())
    stripped = {name: field for name, field in value.items() if name not in clock}
    nested = NESTED_CLOCK_FIELDS.get(kind)
    if nested is not None and isinstance(stripped.get(nested[0]), list):
        name, inner = nested
        stripped[name] = [{k: v for k, v in item.items() if k not in inner} if isinstance(item, dict) else item
                          for item in stripped[name]]
    return stripped
