"""Rollouts in the store: start (validated whole, nothing stored on a refusal), list, get, operator commands,
undo, history.

Start refuses, before anything is written:
- a spec that does not validate: 422 naming the field (`spec.steps.0.setWeight`);
- an unknown revision, or one that serves another model: 422 naming `spec.to` / `spec.from`;
- no `from` and no single revision holding all of the model's traffic: 409 `traffic_split`;
- A and B differing in correctness fields without `allowCorrectnessChange`: 422 naming
  `spec.allowCorrectnessChange`, listing the fields;
- a spec whose analysis needs the quality verdict while it is not measured: 409 `quality_gate_unavailable`;
- another rollout of the model that is not terminal: 409 `rollout_in_progress` naming its id. The unique
  `active_model` column makes this hold between two controllers racing to start one.

The stored spec is the spec as written (aliases), with `from` resolved to A. Commands (pause, resume,
promote, abort, retry) are the machine's pure functions (rollout.commands) applied to the stored state and
written back under the row's version (a concurrent reconcile or command makes the write a 409
`concurrent_change`; `with_retries` re-reads and tries again). Events go to rollout_events; the API audits
the call itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from fleetctl.controller import rollout_observations
from fleetctl.controller.db import Store
from fleetctl.controller.models import ClassRevision, Rollout, RolloutEvent, TrafficPolicy
from fleetctl.controller.rollout import commands
from fleetctl.controller.rollout.analysis import quality_unavailable
from fleetctl.controller.rollout.spec import RolloutSpec
from fleetctl.controller.rollout.state import TERMINAL, RolloutState
from fleetctl.controller.traffic import model_weights, set_traffic
from fleetctl.controller.traffic_guard import CORRECTNESS_CHANGE_ALLOWED, positive_refs
from fleetctl.controller.versions import check_version
from fleetctl.errors import Conflict, NotFound, ValidationFailed
from fleetctl.replica_class import ReplicaClassSpec, diff

COMMANDS = ("pause", "resume", "promote", "abort", "retry")
UNDO = "undo"
CONTROLLER = "controller"  # the actor of what the reconciler does
RETRIES = 5
_NAMED = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*): (.+)$")  # a spec validator names its field first
T = TypeVar("T")


@dataclass(frozen=True)
class Started:
    """What `start` stored, and what the audit record says about an allowed correctness change."""

    row: Rollout
    allowed: list[dict[str, Any]]  # the correctness fields that differ, when allowCorrectnessChange allowed them

    @property
    def audit_code(self) -> str | None:
        return CORRECTNESS_CHANGE_ALLOWED if self.allowed else None

    @property
    def audit_detail(self) -> dict[str, Any] | None:
        if not self.allowed:
            return None
        reason = RolloutSpec.model_validate(self.row.spec).allow_correctness_change
        return {"allow_correctness_change": True, "reason": reason.reason if reason else None,
                "between": [self.row.from_ref, self.row.to_ref], "correctness_differences": self.allowed}


# --- validation ---

def parse_spec(raw: Any) -> RolloutSpec:
    """The spec, or a ValidationFailed naming the first field at fault as `spec.<path>`."""
    try:
        return RolloutSpec.model_validate(raw)
    except ValidationError as exc:
        raise spec_error(exc) from None


def spec_error(exc: ValidationError) -> ValidationFailed:
    first = exc.errors()[0]
    path = _dedupe([str(part) for part in first.get("loc", ())])
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    named = _NAMED.match(message)
    if named:  # e.g. "steps.3.setWeight: 5 is below the previous weight 10"
        path, message = [*path, *named.group(1).split(".")], named.group(2)
    field = ".".join(["spec", *path])
    return ValidationFailed(f"{field}: {message}", field=field)


def _dedupe(path: list[str]) -> list[str]:
    """('steps', '0', 'setWeight', 'setWeight') -> steps.0.setWeight: a step's tag and its field share a name."""
    return [part for i, part in enumerate(path) if i == 0 or part != path[i - 1]]


def revision(session: Session, ref: str, model: str, field: str) -> ClassRevision:
    row = session.get(ClassRevision, ref)
    if row is None:
        raise ValidationFailed(f"{field}: unknown replica class {ref!r}", code="unknown_class", field=field)
    if row.spec.get("model") != model:
        raise ValidationFailed(f"{field}: {ref} serves {row.spec.get('model')!r}, not {model!r}", field=field)
    return row


def holding_all_traffic(session: Session, model: str) -> str:
    """The revision holding all of `model`'s traffic: the only positively weighted one in its policy, else
    its only deployed revision."""
    weights = model_weights(session, model)
    positive = positive_refs(weights)
    if len(positive) == 1:
        return positive[0]
    if not positive:
        raise Conflict(f"spec.from: {model!r} has no traffic and no deployment to roll out from", code="no_traffic",
                       field="spec.from")
    raise Conflict(f"spec.from: {model!r}'s traffic is split over {', '.join(positive)}; name the revision to roll "
                   "out from in `from`", code="traffic_split", field="spec.from")


def correctness_changes(a: ClassRevision, b: ClassRevision) -> list[dict[str, Any]]:
    changes = diff(ReplicaClassSpec.model_validate(a.spec), ReplicaClassSpec.model_validate(b.spec))
    return [{"field": c["field"], "from": c["old"], "to": c["new"]} for c in changes if c["tag"] == "correctness"]


def check_correctness(spec: RolloutSpec, changes: list[dict[str, Any]], a: str, b: str) -> None:
    if changes and spec.allow_correctness_change is None:
        listed = ", ".join(f"{c['field']} {c['from']} -> {c['to']}" for c in changes)
        raise ValidationFailed(
            f"spec.allowCorrectnessChange: {a} and {b} differ in correctness fields ({listed}); outputs may change, "
            "so the spec must say so with allowCorrectnessChange: {reason: ...}", field="spec.allowCorrectnessChange")
    if changes and not spec.requires_quality():
        # a change that may alter answers is gated on answers, not only on latency
        raise ValidationFailed(
            f"spec.templates: {a} and {b} differ in correctness fields, so the rollout needs the quality gate: an "
            "analysis metric with `measure: quality` (the golden-set canary's verdict for B)", field="spec.templates")


def check_quality(spec: RolloutSpec, session: Session, model: str, refs: list[str], now: datetime) -> None:
    why = quality_unavailable(spec, rollout_observations.observe(session, model, refs, now, acknowledged=True))
    if why:
        raise Conflict(why, code="quality_gate_unavailable", field="spec.templates")


def pin_current_traffic(session: Session, model: str, a_ref: str, actor: str, now: datetime) -> None:
    """Store {A: 100} when the model has no traffic policy. Without one the routing table spreads the
    model's traffic over every deployed revision, so B's deployments would get traffic the moment `scale`
    creates them, before their engines are ready. A is the only deployed revision here (else `from` had
    to be named and the policy exists), so this changes no routing."""
    if session.get(TrafficPolicy, model) is None:
        set_traffic(session, model, {a_ref: 100.0}, allow_correctness_change=False, actor=actor, now=now)


def active_rollout(session: Session, model: str) -> Rollout | None:
    return session.execute(select(Rollout).where(Rollout.active_model == model)).scalar_one_or_none()


def refuse_if_active(session: Session, model: str) -> None:
    running = active_rollout(session, model)
    if running is not None:
        raise Conflict(f"rollout {running.id} of {model!r} is {running.phase}; one rollout per model at a time "
                       f"(abort or finish rollout {running.id} first)", code="rollout_in_progress", field="spec.model")


# --- start, read ---

def start(session: Session, raw_spec: Any, actor: str, now: datetime) -> Started:
    spec = parse_spec(raw_spec)
    refuse_if_active(session, spec.model)
    b = revision(session, spec.to, spec.model, "spec.to")
    a_ref = spec.from_ if spec.from_ is not None else holding_all_traffic(session, spec.model)
    if a_ref == b.ref:
        raise Conflict(f"spec.to: all of {spec.model!r}'s traffic is already on {b.ref}", code="nothing_to_roll_out",
                       field="spec.to")
    a = revision(session, a_ref, spec.model, "spec.from")
    changes = correctness_changes(a, b)
    check_correctness(spec, changes, a.ref, b.ref)
    check_quality(spec, session, spec.model, [a.ref, b.ref], now)
    pin_current_traffic(session, spec.model, a.ref, actor, now)
    stored = {**_as_written(spec), "from": a.ref}
    state = RolloutState(updated_at=now, message="started")  # the machine enters step 0 at its first run
    row = Rollout(model=spec.model, from_ref=a.ref, to_ref=b.ref, spec=stored, state=state.to_json(),
                  phase=state.phase, active_model=spec.model, created_at=now, created_by=actor, updated_at=now)
    _insert(session, row, spec.model)
    record_event(session, row.id, actor, "started", f"{a.ref} -> {b.ref}, {len(spec.steps)} step(s)"
                 + (f"; correctness change allowed: {spec.allow_correctness_change.reason}" if changes and
                    spec.allow_correctness_change else ""), now)
    return Started(row, changes)


def _as_written(spec: RolloutSpec) -> dict[str, Any]:
    """The spec as the operator wrote it (aliases, only the fields given), in its validated form."""
    return spec.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _insert(session: Session, row: Rollout, model: str) -> None:
    """Add the row; a rollout started concurrently for the same model wins (the unique active_model)."""
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:
        refuse_if_active(session, model)
        raise


def get_rollout(session: Session, rollout_id: int) -> Rollout:
    row = session.get(Rollout, rollout_id)
    if row is None:
        raise NotFound(f"no rollout {rollout_id}", field="rollout_id")
    return row


def list_rollouts(session: Session, model: str | None = None, active: bool | None = None) -> list[Rollout]:
    query = select(Rollout)
    if model is not None:
        query = query.where(Rollout.model == model)
    if active is True:
        query = query.where(Rollout.active_model.is_not(None))
    if active is False:
        query = query.where(Rollout.active_model.is_(None))
    return list(session.execute(query.order_by(Rollout.id)).scalars())


def history(session: Session, rollout_id: int) -> list[RolloutEvent]:
    get_rollout(session, rollout_id)
    return list(session.execute(
        select(RolloutEvent).where(RolloutEvent.rollout_id == rollout_id).order_by(RolloutEvent.id)).scalars())


def record_event(session: Session, rollout_id: int, actor: str, event: str, message: str, now: datetime) -> None:
    session.add(RolloutEvent(rollout_id=rollout_id, at=now, actor=actor[:65], event=event[:32], message=message))


def spec_of(row: Rollout) -> RolloutSpec:
    return RolloutSpec.model_validate(row.spec)


def state_of(row: Rollout) -> RolloutState:
    return RolloutState.from_json(row.state)


# --- commands ---

# the history event of each command; an abort asked for is "aborting" (traffic on its way back to A): the
# machine records "aborted" once every gateway routes all of it to A and B is drained
PAST = {"pause": "paused", "resume": "resumed", "promote": "promoted", "abort": "aborting", "retry": "retried"}


def command(session: Session, rollout_id: int, verb: str, actor: str, now: datetime, full: bool = False,
            reason: str | None = None, expected_version: int | None = None) -> Rollout:
    """Apply an operator command to the stored state (a CommandRefused is a 409 with the machine's code)."""
    row = get_rollout(session, rollout_id)
    check_version(row, expected_version, f"rollout {rollout_id}")
    state = state_of(row)
    try:
        new = _machine_command(verb, state, now, actor, full, reason)
    except commands.CommandRefused as exc:
        raise Conflict(f"rollout {rollout_id}: {exc.message}", code=exc.code) from None
    if verb == "retry":
        refuse_if_other_active(session, row)
    write_state(session, row, new, now)
    detail = " (full: every remaining step skipped)" if verb == "promote" and full else ""
    said = "abort asked" if verb == "abort" else PAST[verb]
    record_event(session, row.id, actor, PAST[verb], f"{said} by {actor}{detail}" + (f": {reason}" if reason else ""),
                 now)
    return row


def _machine_command(verb: str, state: RolloutState, now: datetime, actor: str, full: bool,
                     reason: str | None) -> RolloutState:
    """The machine's pure command (rollout.commands); CommandRefused when the state does not allow it."""
    if verb == "pause":
        return commands.pause(state, actor, now)
    if verb == "resume":
        return commands.resume(state, now)
    if verb == "promote":
        return commands.promote(state, now, full=full)
    if verb == "abort":
        return commands.abort(state, f"aborted by {actor}" + (f": {reason}" if reason else ""), now)
    if verb == "retry":
        return commands.retry(state, now)
    raise ValidationFailed(f"command: one of {', '.join(COMMANDS)} or {UNDO}, not {verb!r}", field="command")


def refuse_if_other_active(session: Session, row: Rollout) -> None:
    running = active_rollout(session, row.model)
    if running is not None and running.id != row.id:
        raise Conflict(f"rollout {running.id} of {row.model!r} is {running.phase}; retry rollout {row.id} after it "
                       "ends", code="rollout_in_progress")


def write_state(session: Session, row: Rollout, state: RolloutState, now: datetime) -> None:
    """Store the state under the row's version (StaleDataError when someone wrote it since it was read)."""
    row.state, row.phase, row.updated_at = state.to_json(), state.phase, now
    row.active_model = None if state.phase in TERMINAL else row.model
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError:
        refuse_if_other_active(session, row)
        raise


def undo(session: Session, rollout_id: int, actor: str, now: datetime) -> Started:
    """A new rollout back to the finished one's A, with the same steps, templates and analysis."""
    row = get_rollout(session, rollout_id)
    if row.active_model is not None:
        raise Conflict(f"rollout {rollout_id} is {row.phase}; undo a completed or aborted rollout (abort it first)",
                       code="rollout_in_progress")
    spec = dict(row.spec)
    spec.pop("from", None)
    spec["to"] = row.from_ref
    if spec.get("allowCorrectnessChange"):
        spec["allowCorrectnessChange"] = {"reason": f"undo of rollout {rollout_id}: "
                                                    f"{spec['allowCorrectnessChange'].get('reason', '')}"[:2000]}
    started = start(session, spec, actor, now)
    record_event(session, row.id, actor, "undone", f"undone by rollout {started.row.id}", now)
    return started


def with_retries(store: Store, attempt: Callable[[Session], T]) -> T:
    """Run `attempt` in a fresh session until it commits without meeting a concurrent write (the reconciler
    writing the same rollout); the last conflict is raised (the API's 409 `concurrent_change`)."""
    for tries in range(RETRIES):
        try:
            with store.session() as session:
                return attempt(session)
        except StaleDataError:
            if tries == RETRIES - 1:
                raise
    raise AssertionError("unreachable")
