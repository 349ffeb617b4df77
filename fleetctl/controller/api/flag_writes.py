"""Writing a flag override from an API call: the one path `flag set`/`unset` and every break-glass lever
take, so each change is typed by the catalog, audited once under the caller's action, stamped into the
routing generation (gateways apply it at that generation) and wakes the controller's own reconcilers."""

from __future__ import annotations

from typing import Any

from fleetctl.controller import flags, routing_generation, views
from fleetctl.controller.api.deps import Change
from fleetctl.controller.audit import NOOP, OK
from fleetctl.controller.auth import ADMIN, authorize
from fleetctl.errors import ValidationFailed
from fleetctl.flag_catalog import FlagError, FlagSpec, parse_key


def parse(key: str) -> tuple[FlagSpec, str | None]:
    try:
        return parse_key(key)
    except FlagError as exc:
        raise ValidationFailed(str(exc), field=exc.field) from None


def require_reason(change: Change, what: str) -> None:
    if not change.reason:
        raise ValidationFailed(f"reason: {what} needs a reason (X-Fleet-Reason or `reason`)", field="reason")


def require_admin_for(change: Change, spec: FlagSpec) -> None:
    """A break-glass flag (freeze, pin) is changed by an admin only (403 otherwise, audited)."""
    if spec.admin:
        authorize(change.principal, ADMIN)


def write_override(change: Change, key: str, value: Any, ttl_s: float | None, expected: int | None = None,
                   check: Any = None) -> dict[str, Any]:
    """Store the override and audit it; `check(session)` runs first in the same transaction (a refusal
    leaves nothing written). The FlagSetResult body."""
    runtime = change.runtime
    spec, model = parse(key)
    with runtime.store.session() as session:
        if check is not None:
            check(session)
        now = runtime.clock()
        try:
            outcome = flags.set_flag(session, key, value, change.actor, now, expected, change.reason, ttl_s)
        except FlagError as exc:
            raise ValidationFailed(str(exc), field=exc.field) from None
        change.record(session, target=f"flags/{key}", result=OK if outcome.changed else NOOP,
                      detail={"value": value, **({"ttl_s": ttl_s} if ttl_s is not None else {})})
        generation, _table = routing_generation.stamp(session, lambda: views.routing_content(session))
        current = flags.flag_value(session, spec.name, now, model)
    runtime.wake()  # the controller's own flags apply at its next pass: now
    return {"name": key, "value": current, "result": "changed" if outcome.changed else "unchanged",
            "version": outcome.version, "generation": generation,
            "expires_at": outcome.expires_at.isoformat() if outcome.expires_at is not None else None}


def remove_override(change: Change, key: str, expected: int | None = None) -> dict[str, Any]:
    """Remove the override (the flag has its default again) and audit it; the FlagSetResult body."""
    runtime = change.runtime
    spec, _model = parse(key)
    with runtime.store.session() as session:
        removed = flags.unset_flag(session, key, expected)
        change.record(session, target=f"flags/{key}", result=OK if removed else NOOP)
        generation, _table = routing_generation.stamp(session, lambda: views.routing_content(session))
    runtime.wake()
    return {"name": key, "value": spec.default, "result": "changed" if removed else "unchanged", "version": None,
            "generation": generation, "expires_at": None}
