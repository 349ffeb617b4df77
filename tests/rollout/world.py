"""A small simulated fleet for the rollout machine's tests: stored weights that gateways acknowledge after
`ack_after` ticks, B's engines that become ready `ready_after` ticks after a ScaleUp, and per-revision
gateway counters that grow with the traffic each revision gets. Actions are applied as the reconciler
applies them (idempotently); `observe()` is what a reconcile reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from fleetctl.controller.rollout.machine import step, weights_are
from fleetctl.controller.rollout.spec import RolloutSpec
from fleetctl.controller.rollout.state import (
    TERMINAL, Action, Drain, Histogram, Observations, Record, RolloutState, ScaleUp, ServedCounters, SetWeights,
    Transition,
)

A, B = "chat@r1", "chat@r2"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
BOUNDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)  # seconds, like vLLM's TTFT buckets (abridged)


def make_spec(steps: list[dict[str, Any]], **extra: Any) -> RolloutSpec:
    return RolloutSpec.model_validate({"model": "chat", "to": B, "steps": steps, **extra})


def histogram(n: int, seconds: float) -> Histogram:
    """`n` observations, all of `seconds`."""
    counts = tuple(n if seconds <= bound else 0 for bound in BOUNDS)
    return Histogram(BOUNDS, counts, n, n * seconds)


def served(requests: int, errors: int = 0, rejections: int = 0, ttft: float = 0.08, itl: float = 0.02) -> ServedCounters:
    """Counters for `requests` answered, `errors` of them failed before a first token."""
    ok = requests - errors
    return ServedCounters(requests, errors, rejections, histogram(ok, ttft), histogram(ok, itl))


def add(x: ServedCounters, y: ServedCounters) -> ServedCounters:
    def hist(p: Histogram, q: Histogram) -> Histogram:
        if not p.bounds:
            return q
        return Histogram(p.bounds, tuple(i + j for i, j in zip(p.counts, q.counts)), p.count + q.count, p.sum + q.sum)
    return ServedCounters(x.requests + y.requests, x.errors + y.errors, x.rejections + y.rejections,
                          hist(x.ttft, y.ttft), hist(x.itl, y.itl))


@dataclass
class Latency:
    """How a revision serves: TTFT and the share of requests that fail."""

    ttft: float = 0.08
    error_share: float = 0.0


@dataclass
class World:
    ready_after: int = 0  # ticks from ScaleUp until B's engines are ready
    ack_after: int = 0  # ticks from a weights change until every gateway acknowledges
    rate: float = 10.0  # requests per second for the model, over all gateways
    gateways: tuple[str, ...] = ("gw-1", "gw-2")
    weights: dict[str, float] = field(default_factory=lambda: {A: 100.0})
    desired: dict[str, int] = field(default_factory=lambda: {A: 2})
    ready: dict[str, int] = field(default_factory=lambda: {A: 2})
    drifted: dict[str, tuple[str, ...]] = field(default_factory=dict)
    quality: dict[str, str | None] = field(default_factory=dict)
    frozen: bool = False
    serving: dict[str, Latency] = field(default_factory=lambda: {A: Latency(), B: Latency()})
    counters: dict[str, dict[str, ServedCounters]] = field(default_factory=dict)
    now: datetime = T0
    ack_in: int = 0  # ticks left until the current weights are acknowledged
    ready_in: int | None = None  # ticks left until B's desired engines are ready
    applied: list[Action] = field(default_factory=list)

    def observe(self) -> Observations:
        return Observations(weights=dict(self.weights), acknowledged=self.ack_in == 0, ready=dict(self.ready),
                            desired=dict(self.desired), drifted=dict(self.drifted),
                            served={gw: dict(refs) for gw, refs in self.counters.items()},
                            quality=dict(self.quality), frozen=self.frozen)

    def apply(self, action: Action) -> None:
        self.applied.append(action)
        if isinstance(action, SetWeights):
            if not weights_are(self.weights, action.weights):
                self.ack_in = self.ack_after
            self.weights = {ref: w for ref, w in action.weights.items() if w > 0}
        elif isinstance(action, ScaleUp):
            if self.desired.get(action.class_ref, 0) != action.replicas:
                self.desired[action.class_ref] = action.replicas
                self.ready[action.class_ref] = 0
                self.ready_in = self.ready_after
        elif isinstance(action, Drain):
            self.desired[action.class_ref] = 0
            self.ready[action.class_ref] = 0  # draining engines are not routable

    def advance(self, seconds: float) -> None:
        """Time passes: traffic is served on the acknowledged weights, acks and engines make progress."""
        self._serve(seconds)
        self.now += timedelta(seconds=seconds)
        self.ack_in = max(0, self.ack_in - 1)
        if self.ready_in is not None:
            if self.ready_in == 0:
                self.ready[B] = self.desired.get(B, 0)
                self.ready_in = None
            else:
                self.ready_in -= 1

    def _serve(self, seconds: float) -> None:
        total = sum(w for w in self.weights.values() if w > 0)
        for gateway in self.gateways:
            refs = self.counters.setdefault(gateway, {})
            for ref, weight in self.weights.items():
                if weight <= 0 or self.ready.get(ref, 0) == 0:
                    continue
                n = round(self.rate * seconds * weight / total / len(self.gateways))
                latency = self.serving.get(ref, Latency())
                batch = served(n, round(n * latency.error_share), ttft=latency.ttft)
                refs[ref] = add(refs.get(ref, ServedCounters()), batch)


def tick(spec: RolloutSpec, world: World, state: RolloutState, max_wait_s: float = 5.0) -> Transition:
    """One reconcile: step, apply every action, let time pass until the machine wants to look again."""
    transition = step(spec, state, world.observe(), world.now, A, B, replicas=2)
    for action in transition.actions:
        world.apply(action)
    world.advance(min(transition.requeue_after_s or max_wait_s, max_wait_s) or 0.5)
    return transition


def drive(spec: RolloutSpec, world: World, state: RolloutState | None = None, ticks: int = 200,
          until: Callable[[RolloutState], bool] = lambda s: s.phase in TERMINAL) -> tuple[RolloutState, list[Action]]:
    """Ticks until `until(state)` (or `ticks` ran out): the last state and every action, in order."""
    state = state if state is not None else RolloutState()
    actions: list[Action] = []
    for _ in range(ticks):
        if until(state):
            break
        transition = tick(spec, world, state)
        state = transition.state
        actions.extend(transition.actions)
    return state, actions


def records(actions: list[Action], event: str | None = None) -> list[Record]:
    return [a for a in actions if isinstance(a, Record) and (event is None or a.event == event)]
