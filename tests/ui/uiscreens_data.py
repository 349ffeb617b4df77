"""Deterministic data for the Rollouts, Quality, Traffic and Events screens: a WatchSnapshot written by hand
(two models, a paused rollout with gates and a finished one, canary streams with every verdict and some not
measured, a misroute drill, gateways live, behind and stale, events of each source and severity), a
source that sends it and then stays quiet, and a clock that moves only when a test moves it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from fleetctl.controller.contract import GatewayView
from fleetctl.controller.canary_responses import CanaryStreamView
from fleetctl.controller.responses import DrillView, FlagView, RevisionTraffic, TrafficView
from fleetctl.controller.rollout.view import GateView, MeasurementView, RolloutView, StepView
from fleetctl.controller.watch_contract import (
    CONTROLLER_KEY,
    ControllerWatchView,
    FleetEventView,
    PulseView,
    WatchDelta,
    WatchMessage,
    WatchSnapshot,
)
from fleetctl.canary.types import Evidence

T0 = datetime(2026, 3, 14, 9, 26, 53, tzinfo=timezone.utc)
MODEL, OTHER = "smollm2-135m", "qwen-tiny"


def at(seconds: float = 0.0) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


class FrozenClock:
    """The app's clock: T0 until a test moves it."""

    def __init__(self, now: datetime = T0):
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def dumped(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json")


# --- rollouts ---

def _steps(texts: list[str], current: int, phase: str) -> list[StepView]:
    def status(i: int) -> str:
        if phase == "completed":
            return "done"
        return "done" if i < current else "current" if i == current else "pending"
    return [StepView(index=i, kind=text.split()[0], text=text, status=status(i)) for i, text in enumerate(texts)]


def paused_rollout(rollout_id: int = 7, pause_left_s: float | None = 95.0) -> RolloutView:
    texts = ["scale (as many engines as A has)", "setWeight 10", "pause 2m", "analysis latency", "setWeight 100"]
    latency = GateView(analysis="background", template="latency", metric="ttft", measure="ttft_p90_s",
                       condition="result <= 1.2 * baseline", phase="Running", count=2, successful=2, failed=0,
                       inconclusive=0, error=0, failure_limit=0, next_in_s=8.0,
                       latest=MeasurementView(at=at(-10), phase="Successful", value=0.41, baseline=0.38,
                                              threshold=0.456, requests=120, message="ok"))
    errors = GateView(analysis="background", template="latency", metric="errors", measure="error_rate",
                      condition="result < 0.01", phase="Running", count=2, successful=1, failed=1,
                      inconclusive=0, error=0, failure_limit=2,
                      latest=MeasurementView(at=at(-10), phase="Failed", value=0.02, baseline=None,
                                             threshold=0.01, requests=120, message="2% errors"))
    return RolloutView(
        id=rollout_id, model=MODEL, from_ref="chat@r1", to_ref="chat@r2", phase="paused", step_index=2,
        steps=_steps(texts, 2, "paused"), weight=10, weights={"chat@r1": 90.0, "chat@r2": 10.0}, acknowledged=True,
        ready={"chat@r1": 2, "chat@r2": 2}, desired={"chat@r1": 2, "chat@r2": 2}, pause_reason="CanaryPauseStep",
        pause_left_s=pause_left_s, pause_ends_at=at(pause_left_s) if pause_left_s is not None else None,
        gates=[latency, errors], progress=0.4, created_at=at(-300), created_by="alice",
        updated_at=at(-25), version=5, spec={"model": MODEL, "to": "chat@r2"})


def finished_rollout() -> RolloutView:
    texts = ["scale (as many engines as A has)", "setWeight 100"]
    return RolloutView(
        id=3, model=OTHER, from_ref="tiny@r4", to_ref="tiny@r5", phase="completed", step_index=2,
        steps=_steps(texts, 2, "completed"), weight=100, weights={"tiny@r5": 100.0}, acknowledged=True,
        ready={"tiny@r4": 0, "tiny@r5": 1}, desired={"tiny@r4": 0, "tiny@r5": 1}, progress=1.0,
        created_at=at(-7200), created_by="bob", updated_at=at(-6000), version=9, spec={"model": OTHER})


# --- canary ---

def stream(model: str, class_ref: str | None, condition: int | None, verdict: str,
           evidence: Evidence | None = None, blamed: str | None = None) -> CanaryStreamView:
    return CanaryStreamView(model=model, kind="pinned" if class_ref else "production", class_ref=class_ref,
                            condition=condition, batch="mixed" if condition is None else f"b{condition}",
                            verdict=verdict, since=at(-600) if verdict != "not_measured" else None,
                            blamed=blamed, evidence=evidence)


def streams() -> list[CanaryStreamView]:
    failing = Evidence(statistic=7.9, threshold=5.0, probes=40, bad=9, bad_prompts={"arith-3": 5, "caps-1": 4},
                       first_divergence=3)
    calm = Evidence(statistic=0.4, threshold=5.0, probes=40, bad=0)
    production = Evidence(statistic=6.1, threshold=5.0, probes=60, bad=7, served_by={"chat@r2 chat-2": 6, "chat@r1": 1})
    return [
        stream(MODEL, "chat@r1", 1, "healthy", calm), stream(MODEL, "chat@r1", 4, "healthy", calm),
        stream(MODEL, "chat@r1", 8, "healthy", calm), stream(MODEL, "chat@r1", 16, "healthy", calm),
        stream(MODEL, "chat@r2", 1, "drifting", calm), stream(MODEL, "chat@r2", 4, "not_measured"),
        stream(MODEL, "chat@r2", 8, "failing", failing, blamed="chat@r2 chat-2"),
        # chat@r2 b16 is not sent at all: the grid still shows the cell, "not measured"
        stream(MODEL, None, None, "drifting", production, blamed="chat@r2 chat-2"),
        stream(OTHER, "tiny@r5", 1, "not_measured"),
    ]


def drill(active: bool = True) -> DrillView:
    return DrillView(id=4, kind="misroute", model=MODEL, to_ref="chat@r3", fraction=0.15, engine=None, fault=None,
                     started_at=at(-120), ends_at=at(1080), stopped_at=None if active else at(-10),
                     stopped_by=None if active else "alice", created_by="alice", active=active,
                     remaining_s=1080.0 if active else None,
                     description=f"drill 4: misroute 15% of {MODEL}'s traffic to chat@r3 for 20m")


# --- traffic and gateways ---

def _revision(ref: str, weight: float, share: float, ready: int) -> RevisionTraffic:
    return RevisionTraffic(ref=ref, weight=weight, share=share, ready_engines=ready, correctness={})


def traffic() -> list[TrafficView]:
    return [
        TrafficView(model=MODEL, source="policy", weights={"chat@r1": 90.0, "chat@r2": 10.0}, updated_at=at(-25),
                    updated_by="controller", version=12,
                    revisions=[_revision("chat@r1", 90, 0.9, 2), _revision("chat@r2", 10, 0.1, 2),
                               _revision("chat@r3", 0, 0.0, 1)], drill=drill()),
        TrafficView(model=OTHER, source="deployments", weights={"tiny@r5": 1.0}, updated_at=None, updated_by=None,
                    revisions=[_revision("tiny@r5", 1, 1.0, 1)]),
    ]


def gateway(name: str, generation: int, stale: bool = False, age_s: float = 1.2) -> GatewayView:
    return GatewayView(name=name, url=f"http://{name}:8000", generation=generation, table_age_s=age_s,
                       refresh_interval_s=2.0, first_seen=at(-3600), last_seen=at(-30 if stale else -1),
                       seen_ago_s=30.0 if stale else 1.0, stale=stale, reported_by="gateway")


def gateways() -> list[GatewayView]:
    return [gateway("gw-a", 42), gateway("gw-b", 41, age_s=3.4), gateway("gw-c", 37, stale=True, age_s=31.0)]


# --- events ---

def event(n: int, source: str, severity: str, subject: str, message: str, actor: str | None = None) -> FleetEventView:
    return FleetEventView(id=f"{source}:{n}", at=at(-600 + 10 * n), source=source, severity=severity,
                          subject=subject, message=message, actor=actor)


def events() -> list[FleetEventView]:
    return [
        event(1, "audit", "info", "n1", "node.cordon ok: maintenance", "alice"),
        event(2, "rollout", "info", "rollouts/7", "started: chat@r1 -> chat@r2", "alice"),
        event(3, "canary", "alert", "chat@r2", "b8: healthy -> failing: divergence 7.9 over 5"),
        event(4, "rollout", "warning", "rollouts/7", "paused: CanaryPauseStep"),
        event(5, "audit", "alert", MODEL, "traffic.set error: correctness_split_refused", "bob"),
        event(6, "canary", "info", "chat@r1", "b1: not_measured -> healthy"),
    ]


# --- the snapshot, and a source that sends it ---

def snapshot(*, rollouts: Iterable[RolloutView] | None = None, canary: Iterable[CanaryStreamView] | None = None,
             drills: Iterable[DrillView] | None = None, flags: dict[str, Any] | None = None,
             fleet_events: Iterable[FleetEventView] | None = None) -> WatchSnapshot:
    from fleetctl.controller.watch_contract import key_of

    def keyed(kind: str, views: Iterable[Any]) -> dict[str, dict[str, Any]]:
        return {key_of(kind, dumped(view)): dumped(view) for view in views}

    flag_views = {name: dumped(FlagView(value=value, updated_at=at(-900), updated_by="alice"))
                  for name, value in (flags or {}).items()}
    controller = ControllerWatchView(replica="controller-0", leader=True, version="0.9.0", at=at())
    pulse = PulseView(at=at(), window_s=10.0, requests_s=12.5, tokens_s=4210.0, ttft_p50_s=0.12, ttft_p90_s=0.34,
                      itl_p90_s=0.025, rejections_s=0.0, prefix_hit_rate=0.62, routing_table_age_s=1.2, nodes=2,
                      nodes_up=2, engines=5, engines_ready=5, flags={})
    resources = {
        "controller": {CONTROLLER_KEY: dumped(controller)},
        "pulse": {CONTROLLER_KEY: dumped(pulse)},
        "rollout": keyed("rollout", [paused_rollout(), finished_rollout()] if rollouts is None else rollouts),
        "canary_stream": keyed("canary_stream", streams() if canary is None else canary),
        "drill": keyed("drill", [drill()] if drills is None else drills),
        "traffic": keyed("traffic", traffic()),
        "gateway": keyed("gateway", gateways()),
        "flag": flag_views,
    }
    return WatchSnapshot(token="e1-1", at=at(), ping_s=2.0, resources=resources,
                         events=list(events() if fleet_events is None else fleet_events))


def delta(seq: int, *, events_added: Iterable[FleetEventView] = (), changes: list[dict[str, Any]] | None = None
          ) -> WatchDelta:
    return WatchDelta.model_validate({"token": f"e1-{seq}", "at": at(seq), "changes": changes or [],
                                      "events": [dumped(e) for e in events_added]})


class Script:
    """A change stream a test drives: `send` queues messages; the app's worker gets them in order."""

    def __init__(self, *first: WatchMessage):
        self.queue: asyncio.Queue[WatchMessage] = asyncio.Queue()
        for message in first:
            self.queue.put_nowait(message)

    def send(self, message: WatchMessage) -> None:
        self.queue.put_nowait(message)

    def __aiter__(self) -> AsyncIterator[WatchMessage]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[WatchMessage]:
        while True:
            yield await self.queue.get()
