"""Direct actions: what agents and gateways did on a break-glass credential while the controller could not
be asked, uploaded from their journals (engine.contract.direct) once it is back.

Each uploaded action is stored once (by node and sequence number) and written to the audit log under actor
`direct:NODE` and action `direct.ACTION`, with the node's own timestamp in `detail`. An action the node still
holds in force (an agent's drained engine, a gateway's local flag override) is a *divergence* from desired
state: the reconciler does not undo it, and the node keeps it, until the operator adopts it (desired state
takes the action over: the flag override is set centrally, the engine is drained by the controller) or
reverts it (the node drops its override, restarts its engine). An action desired state already agrees with
resolves itself as `matches`. Each node learns the resolutions of its holds in the reply to its next upload.

`divergences` and `resolve` are what `fleetctl breakglass reconcile` lists and does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from engine.contract.direct import DirectAction, DirectUpload
from fleetctl.controller import audit, flags, nodes
from fleetctl.controller.models import Assignment, DirectActionRow
from fleetctl.errors import NotFound, ValidationFailed
from fleetctl.flag_catalog import FlagError, coerce, parse_key, value_of

PENDING, ADOPTED, REVERTED, MATCHES, DONE = "pending", "adopted", "reverted", "matches", "done"
RESOLVED = (ADOPTED, REVERTED, MATCHES)
HOLDING = {"agent": ("drain", "stop"), "gateway": ("flag.set",)}  # actions that leave something in force
Decision = Literal["adopt", "revert"]


def actor_of(kind: str, source: str) -> str:
    return f"direct:{source}"[:65] if kind == "agent" else f"direct:gw:{source}"[:65]


def ingest(session: Session, upload: DirectUpload, now: datetime) -> dict[str, Any]:
    """Store and audit the upload's new actions, note which are still open, settle the ones desired state
    already agrees with. The DirectUploadReply body."""
    known = set(session.execute(select(DirectActionRow.seq).where(
        DirectActionRow.source_kind == upload.kind, DirectActionRow.source == upload.source)).scalars())
    for action in upload.actions:
        if action.seq not in known:
            _store(session, upload.kind, upload.source, action, now)
            known.add(action.seq)
    session.flush()
    open_seqs = set(upload.open)
    rows = _rows_of(session, upload.kind, upload.source)
    central = flags.overrides(session, now)
    for row in rows:
        row.open = row.seq in open_seqs
        if row.state == PENDING and (not row.open or _desired_agrees(session, row, central)):
            row.state = MATCHES if row.open else DONE
            row.resolved_at = now
    acknowledged = max(known, default=0)
    resolved = {str(row.seq): row.state for row in rows if row.seq in open_seqs and row.state in RESOLVED}
    return {"acknowledged": acknowledged, "resolved": resolved}


def _store(session: Session, kind: str, source: str, action: DirectAction, now: datetime) -> None:
    holds = action.action in HOLDING[kind]
    session.add(DirectActionRow(
        source_kind=kind, source=source, seq=action.seq, at=datetime.fromtimestamp(action.at, timezone.utc),
        received_at=now, action=action.action, target=action.target, value=action.value, reason=action.reason,
        open=holds, state=PENDING if holds else DONE, resolved_at=None if holds else now))
    detail = {"seq": action.seq, "at": datetime.fromtimestamp(action.at, timezone.utc).isoformat(),
              "value": action.value, "client": action.client, "node": source, "kind": kind}
    audit.record(session, audit.AuditRecord(
        actor=actor_of(kind, source), action=f"direct.{action.action}", target=f"{source}/{action.target}",
        reason=action.reason, payload_digest=audit.payload_digest(action.model_dump_json().encode()),
        result=audit.OK, status=200, detail=detail), now)


def _rows_of(session: Session, kind: str, source: str) -> list[DirectActionRow]:
    return list(session.execute(select(DirectActionRow).where(
        DirectActionRow.source_kind == kind, DirectActionRow.source == source).order_by(DirectActionRow.seq)).scalars())


def desired_of(session: Session, row: DirectActionRow, central: dict[str, Any]) -> Any:
    """What desired state says about the action's target: the flag's central value (gateway; `central`:
    the overrides in force, flags.overrides), or the engine's assignment ("run", "drain" or "unassigned")
    (agent)."""
    if row.source_kind == "gateway":
        spec, model = parse_key(row.target)
        return value_of(central, spec.name, model)
    assignment = session.get(Assignment, row.target)
    if assignment is None:
        return "unassigned"
    return "drain" if assignment.drain else "run"


def _desired_agrees(session: Session, row: DirectActionRow, central: dict[str, Any]) -> bool:
    try:
        desired = desired_of(session, row, central)
    except FlagError:
        return False
    if row.source_kind == "gateway":
        return desired == row.value and type(desired) is type(row.value)
    return desired in ("drain", "unassigned")


def divergences(session: Session, now: datetime, include_resolved: bool = False) -> list[dict[str, Any]]:
    """Every open direct action that desired state does not agree with (and, with `include_resolved`,
    every other one too), oldest first."""
    query = select(DirectActionRow).order_by(DirectActionRow.id)
    if not include_resolved:
        query = query.where(DirectActionRow.state == PENDING, DirectActionRow.open.is_(True))
    central = flags.overrides(session, now)
    return [divergence_view(session, row, central) for row in session.execute(query).scalars()]


def divergence_view(session: Session, row: DirectActionRow, central: dict[str, Any]) -> dict[str, Any]:
    try:
        desired = desired_of(session, row, central)
    except FlagError:
        desired = None
    return {
        "id": row.id, "kind": row.source_kind, "source": row.source, "seq": row.seq, "at": row.at.isoformat(),
        "action": row.action, "target": row.target, "value": row.value, "reason": row.reason,
        "desired": desired, "open": row.open, "state": row.state,
        "resolved_at": row.resolved_at.isoformat() if row.resolved_at else None, "resolved_by": row.resolved_by,
        "adopt": _adopt_summary(row), "revert": _revert_summary(row),
    }


def _adopt_summary(row: DirectActionRow) -> str:
    if row.source_kind == "gateway":
        return f"set flag {row.target}={row.value} centrally (every gateway)"
    return f"drain engine {row.target} in desired state (a replacement is placed if its deployment wants one)"


def _revert_summary(row: DirectActionRow) -> str:
    if row.source_kind == "gateway":
        return f"gateway {row.source} drops its local {row.target}"
    return f"agent {row.source} restarts engine {row.target}"


@dataclass(frozen=True)
class Resolved:
    row: DirectActionRow
    decision: Decision
    flag_key: str | None  # an adopted gateway override: the flag now set centrally


def resolve(session: Session, ids: list[int], decision: Decision, actor: str, reason: str | None,
            now: datetime) -> list[Resolved]:
    """Adopt or revert each of `ids` (each must be pending and open: 404/409 naming it otherwise).
    Adopting writes desired state (the flag override, the engine drain); the nodes learn at their next
    upload."""
    done = []
    for action_id in ids:
        row = session.get(DirectActionRow, action_id)
        if row is None:
            raise NotFound(f"no direct action {action_id}", field="ids")
        if row.state != PENDING or not row.open:
            raise ValidationFailed(f"ids: direct action {action_id} is {row.state}, not a pending divergence",
                                   field="ids")
        flag_key = _adopt(session, row, actor, reason, now) if decision == "adopt" else None
        row.state = ADOPTED if decision == "adopt" else REVERTED
        row.resolved_at, row.resolved_by = now, actor[:65]
        done.append(Resolved(row, decision, flag_key))
    session.flush()
    return done


def _adopt(session: Session, row: DirectActionRow, actor: str, reason: str | None, now: datetime) -> str | None:
    if row.source_kind == "gateway":
        spec, _model = parse_key(row.target)
        flags.set_flag(session, row.target, coerce(spec, row.value), actor, now, reason=reason)
        return row.target
    if session.get(Assignment, row.target) is not None:
        nodes.drain_engine(session, row.target)
    return None


def pending_count(session: Session) -> int:
    return session.execute(select(func.count()).select_from(DirectActionRow).where(
        DirectActionRow.state == PENDING, DirectActionRow.open.is_(True))).scalar_one()
