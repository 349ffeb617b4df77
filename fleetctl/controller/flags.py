"""Feature flags and kill switches: the store's overrides of the catalog's flags (fleetctl/flag_catalog.py),
served to gateways in the routing table and read by the controller's own reconcilers.

An override has an owner (who set it last), a reason and, when set with a TTL, an expiry. Past its
expiry it no longer counts (`overrides` leaves it out) and the flag reconciler deletes it and audits the
revert (`end_expired`); setting it again renews it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller import audit
from fleetctl.controller.models import FeatureFlag
from fleetctl.controller.versions import check_version
from fleetctl.flag_catalog import CATALOG, FlagValue, coerce, key_of, parse_key, value_of


CONTROLLER = "controller"  # the audit actor of a revert at expiry


@dataclass(frozen=True)
class FlagChange:
    changed: bool  # False: the same value (and expiry) was stored already
    version: int
    expires_at: datetime | None


def set_flag(session: Session, key: str, value: Any, actor: str, now: datetime, expected_version: int | None = None,
             reason: str | None = None, ttl_s: float | None = None) -> FlagChange:
    """Store an override of `key` (a catalog key: FlagError naming the field otherwise). With `ttl_s` it
    expires that long from now; without, it holds until unset. With `expected_version` (If-Match) the
    stored override must be at that version."""
    spec, _model = parse_key(key)
    typed = coerce(spec, value)
    expires_at = now + timedelta(seconds=ttl_s) if ttl_s is not None else None
    row = session.get(FeatureFlag, key)
    check_version(row, expected_version, f"flag {key!r}")
    if row is not None and _counts(row, now) and row.value == typed and type(row.value) is type(typed) \
            and row.expires_at is None and expires_at is None:
        return FlagChange(False, row.version, None)
    if row is None:
        row = FeatureFlag(name=key, value=typed, updated_at=now, updated_by=actor, reason=reason, expires_at=expires_at)
        session.add(row)
    else:
        row.value, row.updated_at, row.updated_by = typed, now, actor
        row.reason, row.expires_at = reason, expires_at
    session.flush()  # assigns (or advances) the version
    return FlagChange(True, row.version, expires_at)


def unset_flag(session: Session, key: str, expected_version: int | None = None) -> bool:
    """Remove the override (the flag has its default again); False when there was none."""
    parse_key(key)
    row = session.get(FeatureFlag, key)
    check_version(row, expected_version, f"flag {key!r}")
    if row is None:
        return False
    session.delete(row)
    session.flush()
    return True


def overrides(session: Session, now: datetime) -> dict[str, Any]:
    """Every override in force (not expired), by key: what gateways and reconcilers resolve flags from."""
    rows = session.execute(select(FeatureFlag).order_by(FeatureFlag.name)).scalars()
    return {row.name: row.value for row in rows if _counts(row, now)}


def flag_value(session: Session, name: str, now: datetime, model: str | None = None) -> FlagValue:
    """One flag's value now: its override in force, else its default."""
    row = session.get(FeatureFlag, key_of(name, model if CATALOG[name].scope == "model" else None))
    return value_of({row.name: row.value} if row is not None and _counts(row, now) else {}, name, model)


def frozen(session: Session, now: datetime) -> bool:
    """Whether rollouts must hold: a break-glass freeze, or the rollout_automation flag off."""
    return bool(flag_value(session, "freeze", now)) or not flag_value(session, "rollout_automation", now)


def reconciler_paused(session: Session, now: datetime) -> bool:
    """Whether placement must change nothing: a break-glass freeze, or the reconciler flag off."""
    return bool(flag_value(session, "freeze", now)) or not flag_value(session, "reconciler", now)


def break_glass(session: Session, now: datetime) -> dict[str, Any]:
    """The break-glass holds in force, for `fleetctl status`: the freeze (its flag view, or None) and each
    pinned model's pin (its flag view, by model)."""
    rows = {row.name: row for row in session.execute(select(FeatureFlag).where(
        (FeatureFlag.name == "freeze") | FeatureFlag.name.like("pin:%"))).scalars() if _counts(row, now)}
    freeze = rows.pop("freeze", None)
    return {
        "frozen": freeze is not None and freeze.value is True,
        "freeze": flag_view("freeze", CATALOG["freeze"], None, freeze, now) if freeze is not None else None,
        "pins": {key.partition(":")[2]: flag_view(key, CATALOG["pin"], key.partition(":")[2], row, now)
                 for key, row in sorted(rows.items())},
    }


def expired(session: Session, now: datetime) -> list[FeatureFlag]:
    return [row for row in session.execute(select(FeatureFlag).where(FeatureFlag.expires_at.is_not(None))
                                           .order_by(FeatureFlag.name)).scalars()
            if row.expires_at is not None and row.expires_at <= now]


def end_expired(session: Session, keys: list[str], now: datetime) -> list[str]:
    """Delete the overrides of `keys` that are past their expiry (one renewed meanwhile is kept), each
    audited with actor `controller` as `flag.expired`; the keys reverted, in order."""
    reverted = []
    for key in keys:
        row = session.get(FeatureFlag, key)
        if row is None or row.expires_at is None or row.expires_at > now:
            continue
        expires_at = row.expires_at  # the row is gone after the delete
        detail = {"value": row.value, "set_by": row.updated_by, "reason": row.reason}
        session.delete(row)
        payload = json.dumps({"key": key, **detail}, sort_keys=True, default=str).encode()
        audit.record(session, audit.AuditRecord(
            actor=CONTROLLER, action="flag.expired", target=f"flags/{key}",
            reason=f"the override's TTL ran out at {expires_at.isoformat()}: back to its default",
            payload_digest=audit.payload_digest(payload), result=audit.OK, status=200, detail=detail), now)
        reverted.append(key)
    session.flush()
    return reverted


def next_expiry(session: Session, now: datetime) -> datetime | None:
    times = [t for t in session.execute(select(FeatureFlag.expires_at).where(FeatureFlag.expires_at.is_not(None)))
             .scalars() if t is not None and t > now]
    return min(times, default=None)


def list_flags(session: Session, now: datetime | None = None) -> dict[str, Any]:
    """Every catalog flag (each per-model flag once per model that has an override) with its value now,
    its default and its override if any, by key."""
    rows = {row.name: row for row in session.execute(select(FeatureFlag).order_by(FeatureFlag.name)).scalars()}
    keys = [name for name, spec in CATALOG.items() if spec.scope == "fleet"] + list(rows)
    views: dict[str, Any] = {}
    for key in sorted(set(keys)):
        try:
            spec, model = parse_key(key)
        except ValueError:  # a row no catalog flag names (written by hand): listed as it is, applied nowhere
            spec, model = None, None
        views[key] = flag_view(key, spec, model, rows.get(key), now)
    return views


def flag_view(key: str, spec: Any, model: str | None, row: FeatureFlag | None, now: datetime | None) -> dict[str, Any]:
    in_force = row is not None and (now is None or _counts(row, now))
    value = (row.value if in_force else None) if spec is None else \
        value_of({key: row.value} if in_force and row is not None else {}, spec.name, model)
    return {
        "name": spec.name if spec is not None else key, "model": model, "value": value,
        "default": spec.default if spec is not None else None, "overridden": in_force,
        "known": spec is not None, "read_by": spec.read_by if spec is not None else None,
        "summary": spec.summary if spec is not None else "not a catalog flag: applied nowhere",
        "updated_at": row.updated_at.isoformat() if row is not None else None,
        "updated_by": row.updated_by if row is not None else None,
        "reason": row.reason if row is not None else None,
        "expires_at": row.expires_at.isoformat() if row is not None and row.expires_at is not None else None,
        "version": row.version if row is not None else None,
    }


def _counts(row: FeatureFlag, now: datetime) -> bool:
    return row.expires_at is None or row.expires_at > now
