"""The fleet as a change stream's client sees it: a snapshot with every delta since applied, in memory.

Pure and synchronous: `apply` takes one parsed message (fleetctl/controller/watch_contract.py) and says what
changed. `fleetctl status --watch` and the TUI both keep one. Values are kept as the JSON dicts the stream
sent and parsed into their typed models (WATCH_MODELS) when read, once per change.

    state = FleetState()
    for message in client.watch():
        changed = state.apply(message)
        for engine in state.engines().values(): ...
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from fleetctl.controller.contract import GatewayView
from fleetctl.controller.canary_responses import CanaryStreamView
from fleetctl.controller.responses import DrillView, FlagView, NodeView, TrafficView
from fleetctl.controller.rollout.view import RolloutView
from fleetctl.controller.watch_contract import (
    CONTROLLER_KEY,
    WATCH_KINDS,
    WATCH_MODELS,
    ControllerWatchView,
    FleetEventView,
    PulseView,
    WatchDelta,
    WatchEngineView,
    WatchMessage,
    WatchPing,
    WatchSnapshot,
)

EVENTS_KEPT = 1000


@dataclass(frozen=True)
class Applied:
    """What one message changed: `reset` (a snapshot replaced everything), else the (kind, key) pairs
    changed and the events added. `patched` names, for a resource changed only by patches, the top-level
    fields they set (a reader can then skip what a field it does not show changed); a resource put or
    deleted is not in it."""

    reset: bool = False
    changed: frozenset[tuple[str, str]] = frozenset()
    events: tuple[FleetEventView, ...] = ()
    patched: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)

    def touches(self, kind: str) -> bool:
        return self.reset or kind in self.kinds

    @cached_property
    def kinds(self) -> frozenset[str]:
        """The kinds of resource changed (a screen asks several times per message)."""
        return frozenset(kind for kind, _ in self.changed)


@dataclass
class FleetState:
    resources: dict[str, dict[str, dict[str, Any]]] = field(default_factory=lambda: {k: {} for k in WATCH_KINDS})
    events: deque[FleetEventView] = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))
    token: str | None = None  # the last token seen: resume from it
    at: str | None = None  # the controller's time of the last message
    snapshots: int = 0  # how many snapshots were applied (1 + reconnects that could not resume)
    _parsed: dict[tuple[str, str], Any] = field(default_factory=dict)

    # --- applying messages ---

    def apply(self, message: WatchMessage) -> Applied:
        self.token, self.at = message.token, message.at
        if isinstance(message, WatchSnapshot):
            return self._reset(message)
        if isinstance(message, WatchPing):
            return Applied()
        return self._delta(message)

    def _reset(self, snapshot: WatchSnapshot) -> Applied:
        # Each value a dict of its own: a patch updates it in place (below)
        self.resources = {kind: {key: dict(value) for key, value in snapshot.resources.get(kind, {}).items()}
                          for kind in WATCH_KINDS}
        self._parsed.clear()
        self.events.clear()
        self.events.extend(snapshot.events)
        self.snapshots += 1
        return Applied(reset=True, events=tuple(snapshot.events))

    def _delta(self, delta: WatchDelta) -> Applied:
        changed = set()
        patched: dict[tuple[str, str], frozenset[str]] = {}
        replaced: set[tuple[str, str]] = set()  # put or deleted (by any change of this delta)
        for change in delta.changes:
            values = self.resources.setdefault(change.kind, {})
            pair = (change.kind, change.key)
            if change.op == "delete":
                values.pop(change.key, None)
                replaced.add(pair)
            elif change.op == "put" or change.key not in values:
                values[change.key] = dict(change.value or {})
                replaced.add(pair)
            else:
                patch = change.value or {}
                # In place, not a merged copy: a copy per engine per second would be a new long-lived object
                # for the garbage collector to walk, and its full passes over a 4,000-engine fleet are slow.
                # Readers keep no value across messages; they read it again when told it changed.
                values[change.key].update(patch)
                before = patched.get(pair)
                patched[pair] = frozenset(patch) if before is None else before.union(patch)
            self._parsed.pop(pair, None)
            changed.add(pair)
        for pair in replaced:
            patched.pop(pair, None)
        self.events.extend(delta.events)
        return Applied(changed=frozenset(changed), events=tuple(delta.events), patched=patched)

    # --- reading ---

    def get(self, kind: str, key: str) -> Any | None:
        """The typed value of `kind`/`key`, None when absent."""
        raw = self.resources.get(kind, {}).get(key)
        if raw is None:
            return None
        parsed = self._parsed.get((kind, key))
        if parsed is None:
            parsed = WATCH_MODELS[kind].model_validate(raw)  # type: ignore[union-attr]
            self._parsed[(kind, key)] = parsed
        return parsed

    def items(self, kind: str) -> dict[str, Any]:
        """key -> typed value of every resource of `kind`, in key order."""
        return {key: self.get(kind, key) for key in sorted(self.resources.get(kind, {}))}

    def keys(self, kind: str) -> Iterable[str]:
        return self.resources.get(kind, {}).keys()

    def controller(self) -> ControllerWatchView | None:
        return self.get("controller", CONTROLLER_KEY)

    def pulse(self) -> PulseView | None:
        return self.get("pulse", CONTROLLER_KEY)

    def nodes(self) -> Mapping[str, NodeView]:
        return self.items("node")

    def engines(self) -> Mapping[str, WatchEngineView]:
        return self.items("engine")

    def gateways(self) -> Mapping[str, GatewayView]:
        return self.items("gateway")

    def rollouts(self) -> Mapping[str, RolloutView]:
        return self.items("rollout")

    def canary_streams(self) -> Mapping[str, CanaryStreamView]:
        return self.items("canary_stream")

    def drills(self) -> Mapping[str, DrillView]:
        return self.items("drill")

    def traffic(self) -> Mapping[str, TrafficView]:
        return self.items("traffic")

    def flags(self) -> Mapping[str, FlagView]:
        return self.items("flag")
