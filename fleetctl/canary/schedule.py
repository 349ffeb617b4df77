"""Which probes to send now, within the budget: pure functions over a snapshot.

Streams. Each model with a reference has:
- one pinned stream per (live class revision, batch condition): its golden prompts pinned to
  that revision, `condition` of them at a time sent together to one engine, every `pinned_interval_s`. The
  rows of the batch are golden prompts, each scored, not fillers: a fault that shows only at batch 4 can show
  in every row, so a batch-4 probe is four observations at about 1.5 times what one golden prompt with three
  short fillers cost. Live means the revision has ready engines, whatever its traffic weight (a rollout's new
  revision at weight 0 is measured before it takes traffic);
- one production stream: its golden prompts through the gateway unpinned, every `production_interval_s`.
A revision whose reference is missing has no pinned streams; a model without any reference has no streams.
Each stream walks its prompts in order (`next_index`, advanced by the rows sent), so every prompt is probed at
every condition in turn.

Urgent streams. A pinned stream is urgent while it is *warming* (fewer than `min_probes` scored probes: a
new revision, which a rollout step waits on) or *suspect* (its statistic is above 0, i.e. bad probes that the
good ones since have not yet explained away, or an alarm is in force). An urgent stream asks for a probe every
`urgent_interval_s`, and a suspect one is pinned to the engine that served its latest bad probe. This spends
the budget where the evidence is: a healthy stream's statistic is 0 nearly all the time, so urgency costs
little then (a stray noisy probe buys about m - 1 quick probes to clear it), while a broken engine is probed
until its alarm comes. The false-alarm target holds: it is a number of probes (the ARL0, designed at the
configured interval), and a stream's mean interval stays well above the configured one.

Budget. Probes may cost `budget_share` of the fleet's busy capacity (the peak served tokens/s the fleet
reached lately, canary_capacity.py): `allowed` tokens/s. What the streams would cost at their configured
intervals (`demand`: each stream's mean tokens per probe, every row of a batch, over its interval) is compared
with it. The floor comes first: every live revision gets at least one pinned probe per `floor_interval_s`
(its batch conditions in turn, so each condition's stream at most len(conditions) x floor_interval_s apart),
every model a production probe per `floor_interval_s`, and what that costs is set aside. The urgent streams
claim up to `urgent_share` of what is left first: a revision serving users with no verdict yet, or a stream
whose bad probe is not yet explained away, is where a probe buys the most (a fault visible only at batch 4,
on one engine, shows in no other stream), and a healthy fleet has no urgent stream, so this costs the
production streams nothing then. The production streams (the mixture users get, the only path that sees a
misroute as users do) get at least `production_share` of what is left after that claim, and all they want
when the others leave room; the urgent streams get the rest of what they want next, stretched (up to their
floor) to fit it, and the other pinned streams what the urgent ones leave. So probes stay within the budget
whenever the budget can pay for the floor; when it cannot (an idle fleet, no capacity measured, or one too
small for its revisions), the floor is spent anyway, since idle capacity costs nobody anything and a revision
at a thin rollout step must still be measured. The factors follow from the expected cost, not from the
measured rate, so they do not swing between "all" and "none" as a measured window fills and empties; the
measured rate is what `BudgetState.share` reports (fleet_canary_probe_share).

Order. At most `concurrency` probes are in flight; a stream with no free slot is not planned again. Of the streams
due, the production streams go first (the path users see), then the most overdue (never probed first).
An engine serves one pinned probe at a time (`busy_engines`, and one per engine in a plan): a batch-1 probe
sent beside a batch-4 one to the same engine would run in one batch of 5, so neither would measure its
condition; the stream less overdue waits for the next turn. A revision's pinned streams start their walk of
its engines at different engines (`Stream.lane`), so with as many engines as conditions they do not wait.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from fleetctl.canary.types import BATCH_CONDITIONS, GoldenPrompt, ProbeKind, StreamKey, StreamState

FIT_STEPS = 60  # bisection steps of fit_factor (the factor to about 1e-18 of its range)
CHAT_MESSAGE_TOKENS = 8  # what a chat template adds per message, roughly (for the estimate below)


@dataclass(frozen=True)
class PromptSlot:
    """A golden prompt and how many prompt tokens one request of it costs (observed, else estimated)."""

    prompt: GoldenPrompt
    prompt_tokens: int


@dataclass(frozen=True)
class ModelTargets:
    """One model: its live class revisions, each with the prompts of the reference it is judged against
    (empty: it has none, so it is not probed), and the production stream's prompts (empty: no reference)."""

    model: str
    revisions: Mapping[str, tuple[PromptSlot, ...]]
    production: tuple[PromptSlot, ...] = ()
    engines: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # revision -> its ready engines, sorted
    # revision -> the batch conditions its reference recorded noise at (absent: every condition of the params);
    # a condition without recorded noise would be judged at the most tolerant p0 (noise.py), at the highest cost
    conditions: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamHistory:
    last_sent: datetime | None = None
    next_index: int = 0  # the prompt to send next (modulo the stream's prompts)
    # its newest probe failed (nothing scored, no tokens spent): due again at its configured interval, not the
    # budget's stretched one, so a new revision the gateways did not route yet is measured soon after they do
    failed: bool = False


@dataclass(frozen=True)
class Urgency:
    """Why a pinned stream is urgent, and the engine a suspect one is pinned to (None: walk the engines)."""

    reason: Literal["warming", "suspect"]
    engine: str | None = None


@dataclass(frozen=True)
class ScheduleSnapshot:
    now: datetime
    enabled: bool  # the canary_probes flag
    models: tuple[ModelTargets, ...]
    streams: Mapping[StreamKey, StreamHistory] = field(default_factory=dict)  # absent: never probed
    spent_tokens: float = 0.0  # probe tokens (every row) sent in the trailing budget window
    busy_capacity: float = 0.0  # the fleet's busy capacity, served tokens/s; 0: not measured (idle)
    in_flight: frozenset[StreamKey] = frozenset()  # streams with no free slot (a pinned one: its one probe)
    in_flight_count: int | None = None  # probes in flight in all; None: len(in_flight)
    # engines serving a pinned probe now: a second pinned probe there would raise the batch both measure
    busy_engines: frozenset[str] = frozenset()
    # pinned streams that are urgent (stream_urgency); absent: not urgent. A pinned stream with no stored
    # state at all is warming: the reconciler marks it so
    urgent: Mapping[StreamKey, Urgency] = field(default_factory=dict)


@dataclass(frozen=True)
class ScheduleParams:
    pinned_interval_s: float
    production_interval_s: float
    floor_interval_s: float
    budget_share: float
    budget_window_s: float  # over which spent_tokens was summed
    concurrency: int
    conditions: tuple[int, ...] = BATCH_CONDITIONS
    urgent_interval_s: float = 15.0  # an urgent pinned stream's interval, before the budget stretches it
    production_share: float = 0.8  # the production streams' least part of what the floor leaves, when others want it
    urgent_share: float = 0.5  # the urgent streams' first claim on what the floor leaves, before production's


@dataclass(frozen=True)
class PlannedProbe:
    stream: StreamKey
    model: str
    kind: ProbeKind
    pin: str | None  # the class revision (x-fleet-pin-class); None on the production path
    prompt: GoldenPrompt  # the batch's first row
    expected_tokens: int  # what it should cost, every row (an upper bound)
    engine: str | None = None  # pinned: the engine of the revision it must be served by (x-fleet-pin-engine)
    companions: tuple[GoldenPrompt, ...] = ()  # the batch's other rows, sent together with `prompt`, each scored

    @property
    def prompt_id(self) -> str:
        return self.prompt.id

    @property
    def prompts(self) -> tuple[GoldenPrompt, ...]:
        """Every row of the batch, in the stream's walk order."""
        return (self.prompt, *self.companions)

    @property
    def condition(self) -> int:
        """The batch condition it is planned at (production: 1, a single row)."""
        return self.stream.condition or 1


@dataclass(frozen=True)
class BudgetState:
    share: float  # measured: probe tokens/s over the busy capacity (0 when no capacity is measured)
    allowed: float  # probe tokens/s the budget allows
    factor: float  # the production streams' intervals are stretched by this (>= 1; inf: no capacity, floor rate)
    demand: float = 0.0  # probe tokens/s the streams would cost at their configured intervals
    pinned_factor: float = 1.0  # the pinned streams' intervals are stretched by this
    urgent_factor: float = 1.0  # the urgent streams' intervals are stretched by this
    urgent: frozenset[StreamKey] = frozenset()

    def factor_for(self, key: StreamKey) -> float:
        if key.kind == "production":
            return self.factor
        return self.urgent_factor if key in self.urgent else self.pinned_factor


@dataclass(frozen=True)
class Stream:
    key: StreamKey
    prompts: tuple[PromptSlot, ...]
    interval_s: float  # configured (urgent_interval_s while urgent), before the budget stretches it
    floor_s: float  # the longest the budget may stretch it to (floor_interval)
    urgent: Urgency | None = None
    # a pinned stream's place among its revision's: it starts its walk of the engines there, so the
    # revision's streams are on different engines at one time (one pinned probe per engine: plan)
    lane: int = 0

    @property
    def rows(self) -> int:
        """Golden prompts per probe: a pinned stream's batch condition (they make its batch), else 1."""
        return self.key.condition or 1


# --- costs ---------------------------------------------------------------------------------------------------


def estimate_prompt_tokens(prompt: GoldenPrompt) -> int:
    """About 4 characters a token, plus a chat template's few tokens per message (before any probe of the
    prompt has reported its real count)."""
    if prompt.messages is not None:
        text = sum(len(m.get("content", "")) for m in prompt.messages)
        return text // 4 + 1 + CHAT_MESSAGE_TOKENS * len(prompt.messages)
    return len(prompt.prompt or "") // 4 + 1


def slot_tokens(slot: PromptSlot) -> int:
    """One row's planned cost: its prompt and max_tokens (an upper bound on its completion)."""
    return slot.prompt_tokens + slot.prompt.sampling.max_tokens


def mean_probe_tokens(stream: Stream) -> float:
    return stream.rows * sum(slot_tokens(s) for s in stream.prompts) / len(stream.prompts)


def batch_slots(stream: Stream, index: int) -> list[PromptSlot]:
    """The rows of the stream's probe at walk position `index`: the next `rows` prompts, wrapping around (a
    set with fewer prompts than rows repeats some)."""
    return [stream.prompts[(index + row) % len(stream.prompts)] for row in range(stream.rows)]


# --- streams, budget, plan -----------------------------------------------------------------------------------

def streams(snapshot: ScheduleSnapshot, params: ScheduleParams) -> list[Stream]:
    """Every stream the snapshot calls for, in key order."""
    found = []
    for target in snapshot.models:
        live = {ref: prompts for ref, prompts in target.revisions.items() if prompts}
        if target.production and target.revisions:
            found.append(Stream(StreamKey(target.model, "production"), target.production, params.production_interval_s,
                                params.floor_interval_s))
        for ref, prompts in live.items():
            keys = revision_keys(target, ref, params)
            floor_s = params.floor_interval_s * len(keys)
            for lane, key in enumerate(keys):
                urgent = snapshot.urgent.get(key)
                interval = min(params.urgent_interval_s, params.pinned_interval_s) if urgent else params.pinned_interval_s
                found.append(Stream(key, prompts, interval, floor_s, urgent, lane))
    return sorted(found, key=lambda s: _order_key(s.key))


def revision_keys(target: ModelTargets, ref: str, params: ScheduleParams) -> list[StreamKey]:
    """The pinned streams of revision `ref`: one per batch condition it is probed at."""
    return [StreamKey(target.model, "pinned", ref, c) for c in revision_conditions(target, ref, params)]


def stream_urgency(state: StreamState | None, min_probes: int, bad_engine: str | None = None) -> Urgency | None:
    """A pinned stream's urgency from its stored state (None: it has none yet, so it is warming): suspect while
    its statistic is above 0 or an alarm is in force (pinned to `bad_engine`, the engine of its latest bad
    probe), warming while it has fewer than `min_probes` scored probes, else not urgent."""
    if state is None:
        return Urgency("warming")
    alarmed = state.divergence.alarmed_at is not None or state.answer.alarmed_at is not None
    if alarmed or state.divergence.steps > 0 or state.answer.steps > 0:
        return Urgency("suspect", bad_engine)
    if state.divergence.probes < min_probes:
        return Urgency("warming")
    return None


def budget_state(snapshot: ScheduleSnapshot, params: ScheduleParams) -> BudgetState:
    """The floor first; then the urgent streams up to `urgent_share` of what is left; then the production
    streams get at least `production_share` of what is left then (all they want when the others leave room);
    the urgent streams get the rest of what they want next, and the other pinned streams what remains."""
    capacity = snapshot.busy_capacity
    recent_rate = snapshot.spent_tokens / params.budget_window_s
    share = recent_rate / capacity if capacity > 0 else 0.0
    allowed = params.budget_share * capacity
    found = streams(snapshot, params)
    production = [s for s in found if s.key.kind == "production"]
    urgent = [s for s in found if s.urgent is not None]
    pinned = [s for s in found if s.key.kind != "production" and s.urgent is None]
    left = allowed - sum(cost(group, math.inf) for group in (production, urgent, pinned))
    wanted = {name: cost(group, 1.0) - cost(group, math.inf)
              for name, group in (("production", production), ("urgent", urgent), ("pinned", pinned))}
    urgent_first = min(wanted["urgent"], params.urgent_share * max(left, 0.0))
    left -= urgent_first
    others = wanted["urgent"] - urgent_first + wanted["pinned"]
    production_part = max(0.0, min(wanted["production"], max(params.production_share * left, left - others)))
    factor = fit_factor(production, cost(production, math.inf) + production_part)
    left -= production_part
    urgent_factor = fit_factor(urgent, cost(urgent, math.inf) + urgent_first + max(left, 0.0))
    left += urgent_first
    left -= cost(urgent, urgent_factor) - cost(urgent, math.inf)
    pinned_factor = fit_factor(pinned, cost(pinned, math.inf) + max(left, 0.0))
    return BudgetState(share=share, allowed=allowed, factor=factor, demand=cost(found, 1.0),
                       pinned_factor=pinned_factor, urgent_factor=urgent_factor,
                       urgent=frozenset(s.key for s in urgent))


def cost(group: Sequence[Stream], factor: float) -> float:
    """Tokens/s the streams cost with their intervals stretched by `factor` (inf: at their floors)."""
    return sum(mean_probe_tokens(s) / effective_interval(s.interval_s, factor, s.floor_s) for s in group)


def fit_factor(group: Sequence[Stream], allowed: float) -> float:
    """The least stretch (>= 1) at which the streams cost at most `allowed` tokens/s: 1 when they fit as
    configured, inf when only their floors fit (or not even those). The cost falls as the factor grows until
    every stream is at its floor, so bisection finds it."""
    rated = [(mean_probe_tokens(s), s) for s in group]  # once: the bisection costs the group many times

    def cost_at(factor: float) -> float:
        return sum(tokens / effective_interval(s.interval_s, factor, s.floor_s) for tokens, s in rated)

    if cost_at(1.0) <= allowed * (1 + 1e-12):  # what others leave it can differ from its cost by a rounding
        return 1.0
    if allowed <= cost_at(math.inf) * (1 + 1e-12):
        return math.inf
    low, high = 1.0, max(s.floor_s / s.interval_s for s in group)  # at `high` every stream is at its floor
    for _ in range(FIT_STEPS):
        mid = (low + high) / 2
        if cost_at(mid) <= allowed:
            high = mid
        else:
            low = mid
    return high


def revision_conditions(target: ModelTargets, ref: str, params: ScheduleParams) -> tuple[int, ...]:
    """The batch conditions `ref` is probed at: those of the params its reference recorded noise at (all of
    the params' when the reference recorded none of them, or is not known)."""
    recorded = set(target.conditions.get(ref, ()))
    return tuple(c for c in params.conditions if c in recorded) or params.conditions


def longest_floor_interval(params: ScheduleParams) -> float:
    """The longest floor interval of any stream: a pinned stream's floor is floor_interval_s x its revision's
    conditions, so that the revision, over all its conditions, gets one probe per floor_interval_s (its
    streams at the floor are due in turn)."""
    return params.floor_interval_s * max(1, len(params.conditions))


def effective_interval(configured_s: float, factor: float, floor_interval_s: float) -> float:
    """The configured interval stretched by the budget's factor, at most the floor interval (but never
    shorter than configured: a configured interval longer than the floor is kept)."""
    return max(configured_s, min(configured_s * factor, floor_interval_s))


def plan(snapshot: ScheduleSnapshot, params: ScheduleParams) -> list[PlannedProbe]:
    """The probes to send now (empty when the flag is off, nothing is due or every slot is taken)."""
    if not snapshot.enabled:
        return []
    busy = len(snapshot.in_flight) if snapshot.in_flight_count is None else snapshot.in_flight_count
    free = params.concurrency - busy
    if free <= 0:
        return []
    budget = budget_state(snapshot, params)
    due = []
    for stream in streams(snapshot, params):
        if stream.key in snapshot.in_flight:
            continue
        overdue = _overdue_s(snapshot, stream, budget.factor_for(stream.key), params)
        if overdue is not None:
            due.append((stream, overdue))
    due.sort(key=lambda item: (item[0].key.kind != "production", -item[1], _order_key(item[0].key)))
    chosen: list[PlannedProbe] = []
    engines = set(snapshot.busy_engines)
    for stream, _ in due:
        if len(chosen) >= free:
            break
        probe = _planned(snapshot, stream)
        if probe.kind == "pinned" and probe.engine is not None:
            # one pinned probe per engine at a time: a class's batch-1 and batch-4 probes sent together to
            # one engine would run as one batch of 5, so neither would measure its condition. The one
            # less overdue waits for the next turn.
            if probe.engine in engines:
                continue
            engines.add(probe.engine)
        chosen.append(probe)
    return chosen


def seconds_to_next_due(snapshot: ScheduleSnapshot, params: ScheduleParams) -> float | None:
    """How long until a stream that is not in flight is due (0: one is due now); None when there are no
    streams (or the flag is off)."""
    if not snapshot.enabled:
        return None
    budget = budget_state(snapshot, params)
    waits = []
    for stream in streams(snapshot, params):
        if stream.key in snapshot.in_flight:
            continue
        history = snapshot.streams.get(stream.key, StreamHistory())
        if history.last_sent is None:
            return 0.0
        interval = stream_interval(stream, history, budget.factor_for(stream.key))
        waits.append(max(0.0, interval - (snapshot.now - history.last_sent).total_seconds()))
    return min(waits, default=None)


def _overdue_s(snapshot: ScheduleSnapshot, stream: Stream, factor: float, params: ScheduleParams) -> float | None:
    """Seconds past due (inf: never probed); None when not due."""
    history = snapshot.streams.get(stream.key, StreamHistory())
    if history.last_sent is None:
        return math.inf
    overdue = (snapshot.now - history.last_sent).total_seconds() - stream_interval(stream, history, factor)
    return overdue if overdue >= 0 else None


def stream_interval(stream: Stream, history: StreamHistory, factor: float) -> float:
    """The stream's interval now: stretched by the budget's factor, unless its newest probe failed."""
    if history.failed:
        return stream.interval_s
    return effective_interval(stream.interval_s, factor, stream.floor_s)


def _planned(snapshot: ScheduleSnapshot, stream: Stream) -> PlannedProbe:
    index = snapshot.streams.get(stream.key, StreamHistory()).next_index
    slots = batch_slots(stream, index)
    key = stream.key
    return PlannedProbe(stream=key, model=key.model, kind=key.kind, pin=key.class_ref, prompt=slots[0].prompt,
                        expected_tokens=sum(slot_tokens(s) for s in slots),
                        engine=pinned_engine(snapshot, key, index // stream.rows, stream.urgent, stream.lane),
                        companions=tuple(s.prompt for s in slots[1:]))


def pinned_engine(snapshot: ScheduleSnapshot, key: StreamKey, index: int, urgent: Urgency | None = None,
                  lane: int = 0) -> str | None:
    """A pinned probe walks its revision's engines with its prompts (the i-th batch of the rotation goes to
    engine (i + lane) mod n, `lane` the stream's place among its revision's): prefix-cache locality would
    otherwise send a golden prompt to the engine that has it cached every time, and a fault on another
    engine of the class would go unseen. A suspect stream goes to
    the engine of its latest bad probe while that engine is ready: a fault on one engine of several then
    shows in every probe rather than in one of n (healthy engines share the class's noise, so where the
    probes go does not change the false-alarm rate). None on the production path (routed as users are) or
    when the engines are not known."""
    if key.kind != "pinned" or key.class_ref is None:
        return None
    target = next((m for m in snapshot.models if m.model == key.model), None)
    engines = target.engines.get(key.class_ref, ()) if target is not None else ()
    if urgent is not None and urgent.engine in engines:
        return urgent.engine
    return engines[(index + lane) % len(engines)] if engines else None


def _order_key(key: StreamKey) -> tuple[str, str, str, int]:
    return (key.model, key.kind, key.class_ref or "", key.condition or 0)


def next_index_after(prompts: Sequence[PromptSlot], prompt_id: str | None) -> int:
    """The index after `prompt_id` in `prompts` (0 when it is not there): how a stream resumes its rotation
    from its last stored probe."""
    ids = [slot.prompt.id for slot in prompts]
    return (ids.index(prompt_id) + 1) % len(ids) if prompt_id in ids else 0
