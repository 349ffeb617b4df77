"""Sending the planned probes, off the reconcile loop, and storing what they found.

`ProbeExecutor` owns one background thread running its own asyncio loop and one httpx.AsyncClient.
`submit` hands it planned probes (schedule.PlannedProbe, each with the gateway to send it through) and
returns at once; each probe then runs as its own task:
1. `send` (default `fleetctl.canary.probe_client.send_probe`) sends each golden prompt of the probe through
   the gateway, pinned or on the production path, all rows of a batch probe at once (they make the batch it
   measures), and returns a ProbeOutput per row or raises;
2. in a worker thread, in a session of its own: per row, in order, the reference the serving class revision is
   judged against (`canary_refs.reference_for`), the score (`scoring.score_probe`), and one canary_probes row.
A probe that failed (an error from the gateway, a timeout, an answer that cannot be scored) is still a row,
with `error` set and no score: the verdicts skip it, and the history shows it.
A stream stays in `in_flight` from `submit` until its row is stored, so the scheduler never plans it twice;
the engine a pinned probe is pinned to stays in `busy_engines` as long, so no second pinned probe joins
its batch.
`stop` cancels what is in flight and ends the thread (leadership lost, the runtime stopping); a later
`submit` starts it again.

The row's condition is the batch condition the engine reported serving the probe at (types.condition_for
of its batch size) when it reported one, else the planned one (vLLM does not report it: the probe relies
on the rows it sent together).

Metrics (on the controller's registry): `fleet_canary_probes_total{model,kind,result}` (result ok | error)
and `fleet_canary_probe_tokens_total{model,kind}` (prompt and completion tokens, as the budget counts
them); the reconciler sets `fleet_canary_probe_share`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.canary.schedule import PlannedProbe
from fleetctl.canary.scoring import score_probe
from fleetctl.canary.types import (ConditionNoise, GoldenPrompt, ProbeOutput, ProbeRecord, PromptReference, StreamKey,
                                   condition_for)
from fleetctl.controller.canary_refs import ChosenReference, reference_for
from fleetctl.controller.db import Store
from fleetctl.controller.models import CanaryProbe
from fleetctl.controller.traffic import model_weights

log = logging.getLogger(__name__)

SendProbe = Callable[..., Awaitable[ProbeOutput]]  # probe_client.send_probe's signature
ERROR_CHARS = 500  # a stored error is one readable line, not a dump
TIMEOUT_GRACE_S = 5.0  # beyond the probe's own timeout, before the executor gives up on `send`
STOP_TIMEOUT_S = 10.0
OK, ERROR = "ok", "error"


async def default_send(client: httpx.AsyncClient, gateway_url: str, model: str, prompt: Any, **kwargs: Any) -> ProbeOutput:
    """The probe client, imported when first used (it is its own module, with its own tests)."""
    from fleetctl.canary.probe_client import send_probe

    return await send_probe(client, gateway_url, model, prompt, **kwargs)


class CanaryProbeMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.share = Gauge("fleet_canary_probe_share", "Probe tokens per second (every row) over the "
                           "fleet's busy capacity, over the budget window.", registry=registry)
        self.probes = Counter("fleet_canary_probes", "Canary probes sent, by outcome (ok: scored; error: "
                              "failed or not scorable).", ["model", "kind", "result"], registry=registry)
        self.tokens = Counter("fleet_canary_probe_tokens", "Tokens canary probes cost (prompt and completion).",
                              ["model", "kind"], registry=registry)

    def count(self, record: ProbeRecord) -> None:
        self.probes.labels(record.model, record.kind, OK if record.error is None else ERROR).inc()
        self.tokens.labels(record.model, record.kind).inc(record.prompt_tokens + record.completion_tokens)


# --- one probe's row ------------------------------------------------------------------------------------------

def failed_record(planned: PlannedProbe, at: datetime, error: str) -> ProbeRecord:
    return ProbeRecord(at=at, model=planned.model, kind=planned.kind, class_ref=planned.pin, condition=planned.condition,
                       prompt_id=planned.prompt_id, error=error[:ERROR_CHARS])


def scored_record(session: Session, planned: PlannedProbe, output: ProbeOutput, at: datetime) -> ProbeRecord:
    """The probe's row: scored against the reference its serving revision is judged against, or, when it
    cannot be scored, with the reason as its error (its token counts kept: they were spent)."""
    class_ref = output.class_ref or planned.pin
    condition = condition_of(planned, output)
    record = ProbeRecord(at=at, model=planned.model, kind=planned.kind, class_ref=class_ref, engine=output.engine,
                         condition=condition, batch_size=output.batch_size, prompt_id=planned.prompt_id,
                         prompt_tokens=output.prompt_tokens, completion_tokens=output.completion_tokens)
    if class_ref is None:
        return _unscored(record, "the gateway did not say which class revision served it (x-fleet-served-by)")
    if planned.pin is not None and class_ref != planned.pin:
        return _unscored(record, f"pinned to {planned.pin} but served by {class_ref}")
    chosen = scoring_reference(session, planned, class_ref)
    if chosen is None:
        return _unscored(record, f"model {planned.model!r} has no reference")
    reference = chosen.reference.prompts.get(planned.prompt_id)
    prompt = next((p for p in chosen.golden.prompts if p.id == planned.prompt_id), None)
    if reference is None or prompt is None:
        return _unscored(record.model_copy(update={"reference_id": chosen.id}),
                         f"prompt {planned.prompt_id!r} is not in reference {chosen.id}")
    if prompt != planned.prompt:
        return _unscored(record.model_copy(update={"reference_id": chosen.id}),
                         f"prompt {planned.prompt_id!r} differs from the one in reference {chosen.id}'s golden set")
    golden = chosen.golden
    judged_by_batch = chosen.mode == "tolerance" and condition > 1
    own_batch1 = batch1_digest(session, class_ref, planned.prompt_id) if judged_by_batch else None
    score = score_probe(output, reference, prompt, chosen.mode, golden.tolerance, noise_at(reference, condition),
                        noise_margin=golden.noise_margin, distance_floor=golden.distance_floor, condition=condition,
                        batch1_digest=own_batch1)
    return record.model_copy(update={"reference_id": chosen.id, "score": score})


def condition_of(planned: PlannedProbe, output: ProbeOutput) -> int:
    """The batch condition the engine reported serving the row at, else the planned one."""
    return condition_for(output.batch_size) if output.batch_size is not None else planned.condition


def batch1_digest(session: Session, class_ref: str | None, prompt_id: str) -> str | None:
    """The digest of `class_ref`'s latest scored answer to the prompt on a pinned probe at batch 1."""
    if class_ref is None:
        return None
    score = session.execute(
        select(CanaryProbe.score).where(CanaryProbe.class_ref == class_ref, CanaryProbe.prompt_id == prompt_id,
                                        CanaryProbe.kind == "pinned", CanaryProbe.condition == 1,
                                        CanaryProbe.error.is_(None))
        .order_by(CanaryProbe.id.desc()).limit(1)).scalar()
    return score.get("tokens_digest") if isinstance(score, dict) else None


def judged_with_tolerance(session: Session, row: PlannedProbe) -> bool:
    chosen = reference_for(session, row.model, row.pin) if row.pin is not None else None
    return chosen is not None and chosen.mode == "tolerance"


def batch1_row(row: PlannedProbe) -> PlannedProbe:
    """The row's prompt alone, on the same engine: its stream's batch-1 sibling."""
    return replace(row, stream=replace(row.stream, condition=1), companions=())


def scoring_reference(session: Session, planned: PlannedProbe, served_by: str) -> ChosenReference | None:
    """What a probe is held to. Pinned: the reference its revision is judged against (reference_for). On the
    production path, a probe served by a revision that carries the model's traffic likewise; one served by a
    revision with no traffic weight (a misroute) is held to the reference of the revision that should have
    served it, the model's heaviest: the answer a user of the model should have got."""
    if planned.kind == "production":
        weights = model_weights(session, planned.model)
        if weights and weights.get(served_by, 0.0) <= 0.0:
            intended = max(sorted(weights), key=lambda ref: weights[ref])
            return reference_for(session, planned.model, intended)
    return reference_for(session, planned.model, served_by)


def noise_at(reference: PromptReference, condition: int) -> ConditionNoise | None:
    """The recorded noise at the probe's batch condition; at a condition not recorded, the noisiest one."""
    if condition in reference.noise:
        return reference.noise[condition]
    return max(reference.noise.values(), key=lambda noise: noise.max_distance, default=None)


def _unscored(record: ProbeRecord, error: str) -> ProbeRecord:
    return record.model_copy(update={"error": error[:ERROR_CHARS]})


def insert_probe(session: Session, record: ProbeRecord) -> int:
    row = CanaryProbe(at=record.at, model=record.model, kind=record.kind, class_ref=record.class_ref,
                      engine=record.engine, condition=record.condition, batch_size=record.batch_size,
                      prompt_id=record.prompt_id, reference_id=record.reference_id,
                      score=record.score.model_dump(mode="json") if record.score is not None else None,
                      prompt_tokens=record.prompt_tokens, completion_tokens=record.completion_tokens,
                      error=record.error)
    session.add(row)
    session.flush()
    return row.id


def describe(exc: BaseException) -> str:
    """One line for a failed send (ProbeError's message says what failed; never the request's headers)."""
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return "timed out"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- the executor -----------------------------------------------------------------------------------------------

class ProbeExecutor:
    def __init__(self, store: Store, send: SendProbe | None = None, *, headers: Mapping[str, str] | None = None,
                 timeout_s: float = 60.0, metrics: CanaryProbeMetrics | None = None, production_slots: int = 1):
        """`headers` go with every probe (the gateway's API key, when it requires one); `timeout_s` is
        one probe's, every row of a batch included."""
        self.store = store
        self.send = send or default_send
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self.metrics = metrics
        self.stored = 0  # rows written (tests wait on it)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._in_flight: Tally[StreamKey] = Tally()
        self._engines: Tally[str] = Tally()  # pinned probes in flight per engine they are pinned to
        # The production stream may have several probes in flight, so its rate is not capped at one probe per
        # probe latency; a pinned stream has one (its rows already make the batch it measures).
        self.production_slots = max(1, production_slots)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Its thread is started (from the first submit until stop)."""
        with self._lock:
            return self._thread is not None

    def in_flight(self) -> frozenset[StreamKey]:
        """The streams that cannot take another probe now (every slot of theirs is in flight)."""
        with self._lock:
            return frozenset(key for key, count in self._in_flight.items() if count >= self._slots(key))

    def in_flight_count(self) -> int:
        with self._lock:
            return sum(self._in_flight.values())

    def busy_engines(self) -> frozenset[str]:
        """The engines a pinned probe in flight is pinned to."""
        with self._lock:
            return frozenset(self._engines)

    def _slots(self, key: StreamKey) -> int:
        return self.production_slots if key.kind == "production" else 1

    def submit(self, probes: Sequence[tuple[PlannedProbe, str]], at: datetime) -> list[StreamKey]:
        """Start each (probe, gateway URL) whose stream is not in flight; returns the streams started."""
        started = []
        with self._lock:
            fresh = [(p, url) for p, url in probes if self._in_flight[p.stream] < self._slots(p.stream)]
            self._in_flight.update(p.stream for p, _ in fresh)
            self._engines.update(p.engine for p, _ in fresh if _pins_engine(p))
        if not fresh:
            return started
        loop = self._ensure_running()
        for planned, url in fresh:
            asyncio.run_coroutine_threadsafe(self._run(planned, url, at), loop)
            started.append(planned.stream)
        return started

    def wait_idle(self, timeout_s: float) -> bool:
        """Until nothing is in flight (tests); False if that took longer than `timeout_s`."""
        with self._idle:
            return self._idle.wait_for(lambda: not +self._in_flight, timeout=timeout_s)

    def stop(self) -> None:
        """Cancel what is in flight and end the thread (idempotent)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=STOP_TIMEOUT_S)
        except Exception:  # stuck or already gone: the thread is a daemon; what it held is dropped
            log.warning("the canary probe executor did not shut down cleanly", exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=STOP_TIMEOUT_S)
        with self._idle:
            self._in_flight.clear()
            self._engines.clear()
            self._idle.notify_all()

    # --- inside the loop ---

    def _ensure_running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is not None:
                return self._loop
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            thread = threading.Thread(target=self._serve, args=(loop, ready), name="fleetctl-canary-probes",
                                      daemon=True)
            self._loop, self._thread = loop, thread
        thread.start()
        ready.wait(STOP_TIMEOUT_S)
        return loop

    def _serve(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        self._client = httpx.AsyncClient()
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())  # the worker threads that store rows
            loop.close()

    async def _shutdown(self) -> None:
        """Cancel every probe task, wait for them to end, close the client."""
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    async def _run(self, planned: PlannedProbe, gateway_url: str, at: datetime) -> None:
        try:
            rows = [row_probe(planned, prompt) for prompt in planned.prompts]
            outcomes = await asyncio.gather(*(self._send_row(row, gateway_url) for row in rows))
            answered = list(zip(rows, outcomes))
            controls = await asyncio.to_thread(self._batch1_controls, answered)
            for control in controls:  # one at a time: each is the class's answer at batch 1
                answered.insert(0, (control, await self._send_row(control, gateway_url)))
            await asyncio.to_thread(self._store_rows, answered, at)
        finally:
            with self._idle:
                self._in_flight[planned.stream] -= 1
                self._in_flight += Tally()  # drops the streams at zero
                if _pins_engine(planned):
                    self._engines[planned.engine] -= 1
                    self._engines += Tally()
                self._idle.notify_all()

    async def _send_row(self, row: PlannedProbe, gateway_url: str) -> ProbeOutput | str:
        """One row's answer, or why it failed (one line)."""
        try:
            assert self._client is not None
            return await asyncio.wait_for(
                self.send(self._client, gateway_url, row.model, row.prompt, kind=row.kind, pin=row.pin,
                          engine=row.engine, headers=self.headers, timeout_s=self.timeout_s),
                self.timeout_s + TIMEOUT_GRACE_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure is the row's outcome, stored; never the loop's end
            log.info("canary probe %s %s failed: %s", row.stream.label(), row.prompt_id, describe(exc))
            return describe(exc)

    def _batch1_controls(self, answered: Sequence[tuple[PlannedProbe, ProbeOutput | str]]) -> list[PlannedProbe]:
        """The batch-1 probes a batch probe's rows need first: a row served at a batch above 1 by a class held
        to tolerance is compared with that class's own answer at batch 1 (scoring.differs_by_batch), and
        where the store has none yet for the prompt, it is asked for now, alone, on the same engine. Each is
        a pinned batch-1 row like any other once stored, so a class pays for each prompt's once."""
        needed = [row for row, outcome in answered
                  if row.kind == "pinned" and isinstance(outcome, ProbeOutput) and condition_of(row, outcome) > 1]
        if not needed:
            return []
        try:
            with self.store.session() as session:
                return [batch1_row(row) for row in needed if judged_with_tolerance(session, row)
                        and batch1_digest(session, row.pin, row.prompt_id) is None]
        except Exception:  # the store is down: the rows are stored without the check, or not at all
            log.exception("looking up batch-1 answers for a canary probe failed")
            return []

    def _store_rows(self, rows: Sequence[tuple[PlannedProbe, ProbeOutput | str]], at: datetime) -> None:
        """One row each, in the walk's order (the stream resumes its walk after the last stored prompt)."""
        for row, outcome in rows:
            self._store(row, outcome, at)

    def _store(self, row: PlannedProbe, outcome: ProbeOutput | str, at: datetime) -> None:
        try:
            with self.store.session() as session:
                record = failed_record(row, at, outcome) if isinstance(outcome, str) else \
                    scored_record(session, row, outcome, at)
                insert_probe(session, record)
        except Exception:  # the store is down: this probe is lost; the stream is due again and retried
            log.exception("storing canary probe %s %s failed", row.stream.label(), row.prompt_id)
            return
        with self._lock:
            self.stored += 1
        if self.metrics is not None:
            self.metrics.count(record)


def row_probe(planned: PlannedProbe, prompt: GoldenPrompt) -> PlannedProbe:
    """One row of a batch probe as a probe of its own: stored, scored and counted per golden prompt."""
    return replace(planned, prompt=prompt, companions=())


def _pins_engine(planned: PlannedProbe) -> bool:
    return planned.kind == "pinned" and planned.engine is not None
