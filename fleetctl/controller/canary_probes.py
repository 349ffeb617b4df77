"""The canary probe reconciler: keeps golden-set probes flowing to every live class revision, within the
probe budget (reconcile/protocol.py; the streams, the budget and the order are fleetctl/canary/schedule.py).

One run:
1. `snapshot` reads:
   - the `canary_probes` feature flag (on unless an override turns it off);
   - the live class revisions per model: revisions of the model's deployments with ready engines
     (traffic.ready_engines_by_role), whatever their traffic weight, so a rollout's new revision is probed
     before it takes traffic;
   - for each, the reference it is judged against (canary_refs.reference_for) and that reference's golden
     prompts; the production stream uses the golden set of the model's newest reference;
   - the live gateways' URLs (reported, not stale);
   - from canary_probes over the trailing horizon: each stream's last probe (merged with what this leader
     planned since, which also covers probes stored at another batch condition than planned), the tokens
     spent in the budget window, and each prompt's observed prompt tokens;
   - the fleet's busy capacity (canary_capacity.py) and the streams in flight (the executor's);
   - each pinned stream's urgency (schedule.stream_urgency) from its stored verdict state (canary_streams),
     with the engine of a suspect stream's latest bad probe.
2. `decide` (pure): schedule.plan, each planned probe paired with a gateway; the budget state; when to run
   again (the next stream's due time, at most MAX_REQUEUE_S so new revisions are noticed).
3. `apply`: hands the probes to the `ProbeExecutor` (non-blocking: it sends, scores and stores them),
   sets `fleet_canary_probe_share`, and deletes probes older than the retention, PRUNE_BATCH at a time.

Gateways that require client API keys (fleetctl/gateway/api_keys.py) need one for the probes:
`canary_probe_api_key` (env FLEET_CANARY_PROBE_API_KEY) is sent as `Authorization: Bearer <key>`; configure
it on the gateways as a probe key without a rate limit (`canary:KEY:0:probe`: only a probe key may send
x-fleet-probe there), so probes are never throttled.

The executor stops when this process loses leadership or stops (`on_leadership_lost`, `close`: the runner
calls them); the next leader starts its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from fleetctl.canary.schedule import (
    BudgetState,
    ModelTargets,
    PlannedProbe,
    PromptSlot,
    ScheduleParams,
    ScheduleSnapshot,
    StreamHistory,
    Urgency,
    budget_state,
    estimate_prompt_tokens,
    longest_floor_interval,
    next_index_after,
    plan,
    revision_keys,
    seconds_to_next_due,
    stream_urgency,
)
from fleetctl.canary.types import PROBES_FLAG, GoldenPrompt, GoldenSet, ProbeRecord, StreamKey, StreamState
from fleetctl.canary.verdict import is_bad
from fleetctl.controller import flags
from fleetctl.controller.canary_capacity import ServedCapacity, read_engines
from fleetctl.controller.canary_executor import CanaryProbeMetrics, ProbeExecutor, SendProbe
from fleetctl.controller.canary_refs import reference_for
from fleetctl.controller.canary_streams import load_streams, probes_by_id
from fleetctl.controller.db import Store
from fleetctl.controller.gateways import is_stale
from fleetctl.controller.metrics import ControllerMetrics
from fleetctl.controller.models import CanaryProbe, CanaryReference, Deployment, Gateway, GoldenSetRow
from fleetctl.controller.reconcile.protocol import Result
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.traffic import ready_engine_rows, ready_engines_by_role

CANARY_PROBES = "canary_probes"  # the reconciler's name
MAX_REQUEUE_S = 10.0
BLOCKED_RETRY_S = 1.0  # every slot taken: look again this soon (a probe takes about a second)
PRUNE_BATCH = 1000


@dataclass(frozen=True)
class JudgedBy:
    """What a revision's pinned streams follow from its reference: the golden prompts it recorded, and the
    batch conditions it recorded noise at."""

    prompts: tuple[GoldenPrompt, ...]
    conditions: tuple[int, ...]


@dataclass(frozen=True)
class CanaryProbeSnapshot:
    schedule: ScheduleSnapshot
    gateways: tuple[str, ...]  # live gateways' URLs, sorted
    prune_before: datetime


@dataclass(frozen=True)
class CanaryProbeDecision:
    probes: tuple[tuple[PlannedProbe, str], ...]  # each with the gateway URL it goes through
    budget: BudgetState
    requeue_after: float | None
    prune_before: datetime
    next_index: Mapping[StreamKey, int] = field(default_factory=dict)  # planned streams' next prompt
    enabled: bool = True


@dataclass
class CanaryProbeReport:
    enabled: bool
    sent: list[str] = field(default_factory=list)  # stream labels handed to the executor
    pruned: int = 0
    share: float = 0.0
    factor: float = 1.0


def schedule_params(settings: ControllerSettings) -> ScheduleParams:
    return ScheduleParams(
        pinned_interval_s=settings.canary_pinned_interval_s, production_interval_s=settings.canary_production_interval_s,
        floor_interval_s=settings.canary_floor_interval_s, budget_share=settings.canary_budget_share,
        budget_window_s=settings.canary_budget_window_s, concurrency=settings.canary_concurrency,
        conditions=settings.batch_conditions, urgent_interval_s=settings.canary_urgent_interval_s,
        production_share=settings.canary_production_share, urgent_share=settings.canary_urgent_share)


def probe_headers(settings: ControllerSettings) -> dict[str, str]:
    key = settings.canary_probe_api_key
    return {"Authorization": f"Bearer {key}"} if key else {}


class CanaryProbeReconciler:
    name = CANARY_PROBES

    def __init__(self, settings: ControllerSettings, store: Store, metrics: ControllerMetrics | None = None,
                 send: SendProbe | None = None, executor: ProbeExecutor | None = None):
        """`send` replaces the probe client (tests); `executor` replaces the executor altogether."""
        self.interval_s = settings.reconcile_interval_s
        self.params = schedule_params(settings)
        self.retention_s = settings.canary_probe_retention_s
        self.min_probes = settings.canary_min_probes
        self.capacity = ServedCapacity(settings.canary_capacity_window_s)
        self.metrics = CanaryProbeMetrics(metrics.registry) if metrics is not None else None
        self.executor = executor or ProbeExecutor(store, send, headers=probe_headers(settings),
                                                  timeout_s=settings.canary_timeout_s, metrics=self.metrics,
                                                  production_slots=settings.canary_concurrency // 2)
        self._planned: dict[StreamKey, StreamHistory] = {}  # what this leader planned (see load_history)
        # (model, ref, newest ref id) -> the prompts and recorded conditions of the reference ref is judged against
        self._prompts: dict[tuple[str, str, int], JudgedBy | None] = {}

    def snapshot(self, session: Session, now: datetime) -> CanaryProbeSnapshot:
        # twice the longest interval: a stream probed a little late is still remembered, and keeps its rotation
        horizon = max(self.params.budget_window_s, 2 * max(self.params.pinned_interval_s,
                                                           self.params.production_interval_s,
                                                           longest_floor_interval(self.params)))
        probes = recent_probes(session, now - timedelta(seconds=horizon))
        observed_tokens = prompt_tokens_seen(probes)
        models = tuple(self._targets(session, model, refs, observed_tokens)
                       for model, refs in sorted(live_revisions(session).items()))
        self._planned = {k: h for k, h in self._planned.items()
                         if h.last_sent is not None and (now - h.last_sent).total_seconds() <= horizon}
        spent = spent_tokens(probes, now - timedelta(seconds=self.params.budget_window_s))
        self.capacity.observe(read_engines(session), now)  # the budget uses the peak over the window
        schedule = ScheduleSnapshot(
            now=now, enabled=probes_enabled(session, now), models=models,
            streams=load_history(probes, models, self._planned), spent_tokens=spent,
            busy_capacity=self.capacity.capacity(now), in_flight=self.executor.in_flight(),
            in_flight_count=self.executor.in_flight_count(), busy_engines=self.executor.busy_engines(),
            urgent=urgent_streams(session, models, self.params, self.min_probes))
        return CanaryProbeSnapshot(schedule, live_gateways(session, now),
                                   now - timedelta(seconds=self.retention_s))

    def decide(self, snapshot: CanaryProbeSnapshot, now: datetime) -> CanaryProbeDecision:
        return decide_probes(snapshot, self.params)

    def apply(self, session: Session, decision: CanaryProbeDecision, now: datetime) -> Result[CanaryProbeReport]:
        pruned = prune_probes(session, decision.prune_before)  # first: a failure here sends nothing
        started = set(self.executor.submit(decision.probes, now)) if decision.probes else set()
        for planned, _url in decision.probes:
            if planned.stream in started:
                self._planned[planned.stream] = StreamHistory(now, decision.next_index[planned.stream])
        if self.metrics is not None:
            self.metrics.share.set(decision.budget.share)
        report = CanaryProbeReport(enabled=decision.enabled, sent=sorted(k.label() for k in started),
                                   pruned=pruned, share=decision.budget.share, factor=decision.budget.factor)
        return Result(report, changed=False, requeue_after=decision.requeue_after)

    def on_leadership_lost(self) -> None:
        self.executor.stop()
        self._planned.clear()

    def close(self) -> None:
        self.executor.stop()

    def _targets(self, session: Session, model: str, refs: Sequence[str],
                 observed_tokens: Mapping[tuple[str, str], int]) -> ModelTargets:
        newest = newest_reference(session, model)
        if newest is None:
            return ModelTargets(model, {ref: () for ref in refs})
        judged = {ref: self._judged_by(session, model, ref, newest[0]) for ref in refs}
        revisions = {ref: _slots(model, j.prompts if j else None, observed_tokens) for ref, j in judged.items()}
        production = _slots(model, golden_prompts(session, newest[1], newest[2]), observed_tokens)
        return ModelTargets(model, revisions, production, ready_engine_names(session, refs),
                            conditions={ref: j.conditions for ref, j in judged.items() if j})

    def _judged_by(self, session: Session, model: str, ref: str, newest_id: int) -> JudgedBy | None:
        """The golden prompts and recorded batch conditions of the reference `ref` is judged against; cached
        until the model gets a new reference (the choice depends only on the references and on immutable
        class revisions)."""
        key = (model, ref, newest_id)
        if key not in self._prompts:
            if len(self._prompts) > 1024:
                self._prompts.clear()
            chosen = reference_for(session, model, ref)
            self._prompts[key] = None if chosen is None else JudgedBy(
                tuple(p for p in chosen.golden.prompts if p.id in chosen.reference.prompts),
                tuple(sorted({c for p in chosen.reference.prompts.values() for c in p.noise})))
        return self._prompts[key]



def _slots(model: str, prompts: Sequence[GoldenPrompt] | None,
           observed_tokens: Mapping[tuple[str, str], int]) -> tuple[PromptSlot, ...]:
    return tuple(PromptSlot(p, observed_tokens.get((model, p.id)) or estimate_prompt_tokens(p)) for p in prompts or ())


# --- decide (pure) ----------------------------------------------------------------------------------------------

def decide_probes(snapshot: CanaryProbeSnapshot, params: ScheduleParams) -> CanaryProbeDecision:
    schedule = snapshot.schedule
    budget = budget_state(schedule, params)
    planned = plan(schedule, params) if snapshot.gateways else []
    paired = tuple((p, choose_gateway(snapshot.gateways, p, schedule)) for p in planned)
    next_index = {p.stream: schedule.streams.get(p.stream, StreamHistory()).next_index + len(p.prompts)
                  for p in planned}
    # as if what is in flight were done: each stream is next due at its interval after it was sent
    after = replace(schedule, in_flight=frozenset(), in_flight_count=0, busy_engines=frozenset(),
                    streams={**schedule.streams, **{p.stream: StreamHistory(schedule.now, next_index[p.stream])
                                                    for p in planned}})
    return CanaryProbeDecision(paired, budget, requeue_after(after, params, bool(snapshot.gateways)),
                               snapshot.prune_before, next_index, schedule.enabled)


def choose_gateway(gateways: Sequence[str], planned: PlannedProbe, schedule: ScheduleSnapshot) -> str:
    """A gateway per (stream, prompt turn): spread over the gateways, the same for the same snapshot."""
    turn = schedule.streams.get(planned.stream, StreamHistory()).next_index
    digest = hashlib.sha256(f"{planned.stream.label()}|{turn}".encode()).digest()
    return gateways[int.from_bytes(digest[:4], "big") % len(gateways)]


def requeue_after(after: ScheduleSnapshot, params: ScheduleParams, have_gateways: bool) -> float | None:
    """When to look again: the next stream's due time (soon if one is due but every slot is taken), at most
    MAX_REQUEUE_S; None (the reconciler's interval) when there is nothing to probe."""
    if not after.enabled or not have_gateways:
        return None
    wait = seconds_to_next_due(after, params)
    if wait is None:
        return None
    if wait <= 0:  # due, but every slot is taken (or its last probe is still in flight)
        return BLOCKED_RETRY_S
    return min(wait, MAX_REQUEUE_S)


# --- reads ------------------------------------------------------------------------------------------------------

def probes_enabled(session: Session, now: datetime) -> bool:
    """The canary_probes flag (fleetctl/flag_catalog.py): on unless an override in force turns it off."""
    return bool(flags.flag_value(session, PROBES_FLAG, now))


def live_revisions(session: Session) -> dict[str, list[str]]:
    """model -> its deployments' class revisions that have ready engines (any traffic weight)."""
    pairs = set(session.execute(select(Deployment.model, Deployment.class_ref)).tuples())
    ready = ready_engines_by_role(session, {ref for _, ref in pairs})
    live = {ref for (ref, _role), count in ready.items() if count > 0}
    result: dict[str, list[str]] = {}
    for model, ref in sorted(pairs):
        if ref in live:
            result.setdefault(model, []).append(ref)
    return result


def ready_engine_names(session: Session, refs: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """class revision -> the names of its ready engines (as traffic counts them), sorted."""
    names: dict[str, list[str]] = {}
    for _node, name, ref, _role in ready_engine_rows(session, refs):
        names.setdefault(ref, []).append(name)
    return {ref: tuple(sorted(found)) for ref, found in names.items()}


def newest_reference(session: Session, model: str) -> tuple[int, str, int] | None:
    """(id, golden set, golden version) of the model's newest reference."""
    row = session.execute(select(CanaryReference.id, CanaryReference.golden_set, CanaryReference.golden_version)
                          .where(CanaryReference.model == model).order_by(CanaryReference.id.desc()).limit(1)).first()
    return None if row is None else (row[0], row[1], row[2])


def golden_prompts(session: Session, name: str, version: int) -> tuple[GoldenPrompt, ...]:
    row = session.get(GoldenSetRow, (name, version))
    return () if row is None else tuple(GoldenSet.model_validate(row.body).prompts)


def live_gateways(session: Session, now: datetime) -> tuple[str, ...]:
    urls = []
    for row in session.execute(select(Gateway).where(Gateway.url.is_not(None))).scalars():
        seen_ago_s = max((now - row.last_seen_at).total_seconds(), 0.0)
        if row.url and not is_stale(seen_ago_s, row.refresh_interval_s):
            urls.append(row.url.rstrip("/"))
    return tuple(sorted(set(urls)))


@dataclass(frozen=True)
class StoredProbe:
    id: int
    at: datetime
    model: str
    kind: str
    class_ref: str | None
    condition: int
    prompt_id: str
    prompt_tokens: int
    completion_tokens: int
    failed: bool = False  # stored with an error, unscored

    @property
    def stream(self) -> StreamKey:
        if self.kind == "production":
            return StreamKey(self.model, "production")
        return StreamKey(self.model, "pinned", self.class_ref, self.condition)


def recent_probes(session: Session, since: datetime) -> list[StoredProbe]:
    rows = session.execute(
        select(CanaryProbe.id, CanaryProbe.at, CanaryProbe.model, CanaryProbe.kind, CanaryProbe.class_ref,
               CanaryProbe.condition, CanaryProbe.prompt_id, CanaryProbe.prompt_tokens, CanaryProbe.completion_tokens,
               CanaryProbe.error)
        .where(CanaryProbe.at >= since).order_by(CanaryProbe.id)).tuples()
    return [StoredProbe(*row[:-1], failed=row[-1] is not None) for row in rows]


def spent_tokens(probes: Sequence[StoredProbe], since: datetime) -> float:
    return float(sum(p.prompt_tokens + p.completion_tokens for p in probes if p.at >= since))


def prompt_tokens_seen(probes: Sequence[StoredProbe]) -> dict[tuple[str, str], int]:
    seen: dict[tuple[str, str], int] = {}
    for p in probes:
        if p.prompt_tokens > 0:
            seen[(p.model, p.prompt_id)] = max(seen.get((p.model, p.prompt_id), 0), p.prompt_tokens)
    return seen


def load_history(probes: Sequence[StoredProbe], models: Sequence[ModelTargets],
                 planned: Mapping[StreamKey, StreamHistory]) -> dict[StreamKey, StreamHistory]:
    """Each stream's last probe: the later of its newest stored row and what this leader planned (a probe
    planned at b4 may be stored at b8, when the engine reported a bigger batch), and its next prompt: after
    what this leader planned, else after the stored row's prompt."""
    last: dict[StreamKey, StoredProbe] = {}
    for p in probes:
        last[p.stream] = p  # ordered by id: the newest wins
    production = {t.model: t.production for t in models}
    pinned = {(t.model, ref): slots for t in models for ref, slots in t.revisions.items()}
    history: dict[StreamKey, StreamHistory] = {}
    for key, probe in last.items():
        slots = production.get(key.model, ()) if key.kind == "production" else pinned.get((key.model, key.class_ref or ""), ())
        history[key] = StreamHistory(probe.at, next_index_after(slots, probe.prompt_id), probe.failed)
    for key, mine in planned.items():
        stored = history.get(key, StreamHistory())
        times = [t for t in (mine.last_sent, stored.last_sent) if t is not None]
        # the stored row's failure counts while it is the newest probe (a later one is still in flight)
        failed = stored.failed and (mine.last_sent is None or stored.last_sent is not None
                                    and stored.last_sent >= mine.last_sent)
        history[key] = StreamHistory(max(times, default=None), mine.next_index, failed)
    return history


def urgent_streams(session: Session, models: Sequence[ModelTargets], params: ScheduleParams,
                   min_probes: int) -> dict[StreamKey, Urgency]:
    """The pinned streams of `models` that are urgent (schedule.stream_urgency), from their stored states; a
    suspect one with the engine of its latest bad probe (among the probes it keeps as evidence)."""
    states = dict(load_streams(session))
    wanted = [key for target in models for ref, prompts in target.revisions.items() if prompts
              for key in revision_keys(target, ref, params)]
    found = {key: stream_urgency(states.get(key), min_probes) for key in wanted}
    suspect = [key for key, urgency in found.items() if urgency is not None and urgency.reason == "suspect"]
    window = probes_by_id(session, [i for key in suspect for i in states[key].recent])
    for key in suspect:
        found[key] = Urgency("suspect", latest_bad_engine(states[key], window))
    return {key: urgency for key, urgency in found.items() if urgency is not None}


def latest_bad_engine(state: StreamState, window: Mapping[int, ProbeRecord]) -> str | None:
    """The engine of the newest bad probe among the stream's evidence (None: none there, or not loaded)."""
    for probe_id in reversed(state.recent):
        probe = window.get(probe_id)
        if probe is not None and is_bad(probe) and probe.engine:
            return probe.engine
    return None


def prune_probes(session: Session, before: datetime, limit: int = PRUNE_BATCH) -> int:
    """Delete up to `limit` of the oldest probes older than `before`; returns how many."""
    ids = list(session.execute(select(CanaryProbe.id).where(CanaryProbe.at < before)
                               .order_by(CanaryProbe.id).limit(limit)).scalars())
    if not ids:
        return 0
    session.execute(delete(CanaryProbe).where(CanaryProbe.id.in_(ids)).execution_options(synchronize_session=False))
    return len(ids)

