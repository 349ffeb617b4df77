"""Deterministic stream data for the TUI core's tests: stream values built and validated with the API's
own models, a scripted source the test feeds, and a fixed clock.

    script = Script(small_fleet())
    app = make_app(source=script, clock=fixed_clock)
    script.push(delta(change("engine", "node-1/e-1", {"state": "failed"})))
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from fleetctl.controller.responses import NodeView
from fleetctl.controller.watch_contract import (
    ControllerWatchView,
    FleetEventView,
    PulseView,
    WatchChange,
    WatchDelta,
    WatchEngineView,
    WatchSnapshot,
)

NOW = datetime(2026, 5, 4, 12, 0, 30, tzinfo=timezone.utc)
AT = NOW.isoformat()


def fixed_clock() -> datetime:
    return NOW


class Script:
    """An async iterable of stream items: those given, then what `push` adds, until `end()`."""

    _END = object()

    def __init__(self, *items: Any) -> None:
        self._items: asyncio.Queue[Any] | None = None
        self._pending = list(items)

    def _queue(self) -> asyncio.Queue[Any]:
        if self._items is None:  # made in the app's loop
            self._items = asyncio.Queue()
            for item in self._pending:
                self._items.put_nowait(item)
            self._pending.clear()
        return self._items

    def push(self, *items: Any) -> None:
        if self._items is None:
            self._pending.extend(items)
        else:
            for item in items:
                self._items.put_nowait(item)

    def end(self) -> None:
        self.push(self._END)

    async def __aiter__(self) -> AsyncIterator[Any]:
        queue = self._queue()
        while True:
            item = await queue.get()
            if item is self._END:
                return
            yield item


def node(name: str, state: str = "up", cordoned: bool = False, draining: bool = False, engines: int = 2) -> dict[str, Any]:
    value = {"name": name, "url": f"http://127.0.0.1:9{name[-1]}00", "state": state, "cordoned": cordoned,
             "draining": draining, "labels": {}, "capacity": {"engines": 4, "kv_mib": 1024},
             "agent_version": "0.1.0", "engines": engines, "last_heartbeat_at": AT, "heartbeat_age_s": 1.0,
             "generation": 3, "applied_generation": 3, "cut_off_s": None, "registered_at": AT}
    return NodeView.model_validate(value).model_dump(mode="json")


def engine(node_name: str, name: str, *, role: str = "mixed", class_ref: str = "chat@r1", state: str = "ready",
           drain: bool = False, running: int = 1, waiting: int = 0, kv: float = 0.25, ttft: float | None = 0.12,
           itl: float | None = 0.021, hit: float | None = 0.5, restarts: int = 0,
           drift: Iterable[dict[str, Any]] = (), model: str = "smollm2-135m") -> dict[str, Any]:
    value = {"name": name, "node": node_name, "deployment": "local", "model": model, "class_ref": class_ref,
             "role": role, "state": state, "drain": drain, "url": f"http://127.0.0.1:81{name[-1]}0", "port": 8100,
             "pid": 4242, "kv_events_endpoint": None, "restarts": restarts, "last_exit": None,
             "metrics": {"num_requests_running": running, "num_requests_waiting": waiting, "kv_cache_usage_perc": kv},
             "updated_at": (NOW - timedelta(seconds=2)).isoformat(), "drift": list(drift),
             "rates": {"window_s": 2.0, "tokens_s": 40.0, "prefix_hit_rate": hit, "ttft_s": ttft, "itl_s": itl}}
    return WatchEngineView.model_validate(value).model_dump(mode="json")


def pulse(**overrides: Any) -> dict[str, Any]:
    value = {"at": AT, "window_s": 10.0, "requests_s": 12.3, "tokens_s": 4567.0, "ttft_p50_s": 0.12, "ttft_p90_s": 0.34,
             "itl_p90_s": 0.025, "rejections_s": 0.0, "prefix_hit_rate": 0.62, "routing_table_age_s": 1.2,
             "nodes": 3, "nodes_up": 3, "engines": 5, "engines_ready": 3, "engines_unhealthy": 1, "drifted": 1,
             "frozen": False, "flags": {"canary.probes": True}, **overrides}
    return PulseView.model_validate(value).model_dump(mode="json")


def controller() -> dict[str, Any]:
    return ControllerWatchView(replica="controller-0", leader=True, version="0.1.0", at=AT).model_dump(mode="json")


def event(number: int, subject: str, message: str, severity: str = "info") -> FleetEventView:
    at = (NOW - timedelta(seconds=60 - number)).isoformat()
    return FleetEventView(id=f"audit:{number}", at=at, source="audit", severity=severity,  # type: ignore[arg-type]
                          subject=subject, message=message, actor="ops")


DRIFT = [{"field": "max_num_seqs", "declared": 64, "actual": 32, "source": "engine"}]


def small_engines() -> dict[str, dict[str, Any]]:
    engines = [
        engine("node-1", "e-1", role="prefill", kv=0.62, running=3, waiting=1),
        engine("node-1", "e-2", role="decode", kv=0.30, ttft=0.45, itl=0.033),
        engine("node-2", "e-3", role="decode", state="failed", kv=0.0, running=0, restarts=3, ttft=None, itl=None),
        engine("node-2", "e-4", role="mixed", drain=True, kv=0.9, running=6, waiting=4),
        engine("node-10", "e-5", role="decode", class_ref="chat@r2", state="starting", kv=0.0, running=0,
               ttft=None, itl=None, hit=None),
        engine("node-10", "e-6", role="mixed", drift=DRIFT, kv=0.45),
    ]
    return {f"{e['node']}/{e['name']}": e for e in engines}


def small_nodes() -> dict[str, dict[str, Any]]:
    nodes = [node("node-1"), node("node-2", cordoned=True), node("node-10"), node("node-3", state="down", engines=0)]
    return {n["name"]: n for n in nodes}


def small_fleet(token: str = "e1-1", events: Iterable[FleetEventView] = ()) -> WatchSnapshot:
    """4 nodes (node-2 cordoned, node-3 down and empty), 6 engines: ready, failed, marked for drain,
    starting, drifted."""
    return WatchSnapshot(token=token, at=AT, ping_s=5.0, events=list(events), resources={
        "controller": {"fleet": controller()}, "pulse": {"fleet": pulse()},
        "node": small_nodes(), "engine": small_engines(),
    })


def change(kind: str, key: str, value: dict[str, Any] | None, op: str = "patch") -> WatchChange:
    return WatchChange(kind=kind, key=key, op=op, value=value)  # type: ignore[arg-type]


def delta(*changes: WatchChange, token: str = "e1-2", events: Iterable[FleetEventView] = ()) -> WatchDelta:
    return WatchDelta(token=token, at=AT, changes=list(changes), events=list(events))


def metrics_delta(key: str, step: int, token: str) -> WatchDelta:
    """A deterministic metrics change of one engine (for sparkline history)."""
    return delta(change("engine", key, {
        "metrics": {"num_requests_running": step % 5, "num_requests_waiting": step % 3,
                    "kv_cache_usage_perc": (step % 10) / 10},
        "rates": {"window_s": 2.0, "tokens_s": 40.0, "prefix_hit_rate": 0.5, "ttft_s": 0.1 + (step % 7) / 20,
                  "itl_s": 0.02 + (step % 4) / 100},
    }), token=token)
