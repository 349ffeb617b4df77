"""Direct mode on the gateway: flag overrides set here, on this gateway's break-glass credential, without the
controller (a pin, a shed, a kill switch: `fleetctl --direct URL breakglass pin ...`).

    GET    /fleet/direct              the flags in effect, the local overrides, the journal
    PUT    /fleet/direct/flags/{key}  {"value": ..., "reason": ...}: a local override of a catalog flag
    DELETE /fleet/direct/flags/{key}  {"reason": ...}: drop the local override (the table's value again)
    POST   /fleet/direct/rotate       a new credential (the old one stops working at once)

A local override lies over the routing table's flags until the operator resolves it: adopted (the
controller now serves the same value, so the override is dropped) or reverted (dropped: the controller's
value again), learned in the reply to the next upload (`sync`, after each report to the controller).
Overrides are kept in `local-flags.json` in the state directory, so a restarted gateway keeps them; every
change is first written to the direct-action journal (engine.contract.direct), fsynced.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from engine.contract.direct import (
    DirectAction, DirectJournal, DirectUpload, DirectUploadReply, bearer_problem, ensure_credential, load_json,
    new_credential, write_atomically,
)
from fleetctl.flag_catalog import FlagError, coerce, parse_key
from fleetctl.gateway.errors import BadRequest, GatewayError, Unauthorized
from fleetctl.gateway.routing_table import RoutingTable
from fleetctl.inventory import GATEWAY_CREDENTIAL_FILE

log = logging.getLogger(__name__)

LOCAL_FLAGS_FILE = "local-flags.json"


def direct_flags(settings: Any) -> "LocalFlags | None":
    """The gateway's direct mode, when it has a state directory: its credential is `breakglass_token`, else
    the one in `breakglass_token_file` (default STATE_DIR/breakglass_token, written on first start)."""
    if settings.state_dir is None:
        return None
    credential_file = settings.breakglass_token_file or settings.state_dir / GATEWAY_CREDENTIAL_FILE
    credential = settings.breakglass_token or ensure_credential(credential_file)
    return LocalFlags(settings.state_dir, credential, credential_file)


class DirectDisabled(GatewayError):
    status_code = 404
    error_type = "NotFoundError"


class LocalFlags:
    """This gateway's local flag overrides (key -> {value, seq}) and its direct-action journal."""

    def __init__(self, state_dir: Path, credential: str, credential_file: Path | None = None):
        self.state_dir, self.credential, self.credential_file = state_dir, credential, credential_file
        self.journal = DirectJournal(state_dir)
        self.path = state_dir / LOCAL_FLAGS_FILE
        self.overrides: dict[str, dict[str, Any]] = load_json(self.path, {})

    # --- the request path ---

    def overlay(self, table: RoutingTable) -> RoutingTable:
        """`table` with the local overrides over its flags (the same object when there are none)."""
        if not self.overrides:
            return table
        flags = {**table.flags, **{key: o["value"] for key, o in self.overrides.items()}}
        return dataclasses.replace(table, flags=flags)

    # --- the operator's calls ---

    def authorize(self, header: str | None) -> None:
        problem = bearer_problem(header, self.credential)
        if problem is not None:
            raise Unauthorized(problem)

    def set(self, key: str, value: Any, table: RoutingTable | None, reason: str | None, client: str | None) -> DirectAction:
        typed = _typed(key, value, table)
        entry = self.journal.append("flag.set", key, typed, reason, client)
        self.overrides[key] = {"value": typed, "seq": entry.seq}
        self._save()
        log.warning("direct: flag %s=%r set locally (%s)", key, typed, reason or "no reason given")
        return entry

    def unset(self, key: str, reason: str | None, client: str | None) -> DirectAction:
        _parse(key)
        entry = self.journal.append("flag.unset", key, None, reason, client)
        self.overrides.pop(key, None)
        self._save()
        log.warning("direct: local override of %s dropped (%s)", key, reason or "no reason given")
        return entry

    def rotate(self) -> str:
        credential = new_credential()
        if self.credential_file is not None:
            write_atomically(self.credential_file, credential + "\n", mode=0o600)
        self.credential = credential
        log.warning("break-glass credential rotated")
        return credential

    def state(self, table: RoutingTable | None) -> dict[str, Any]:
        return {"generation": table.generation if table else None,
                "flags": dict(self.overlay(table).flags) if table else dict(self.local_values()),
                "local": self.overrides, "uploaded": self.journal.uploaded(),
                "actions": [e.model_dump(mode="json") for e in self.journal.entries()]}

    def local_values(self) -> dict[str, Any]:
        return {key: o["value"] for key, o in self.overrides.items()}

    # --- the controller's side ---

    def upload(self, name: str) -> DirectUpload | None:
        pending, open_seqs = self.journal.pending(), sorted(o["seq"] for o in self.overrides.values())
        if not pending and not open_seqs:
            return None
        return DirectUpload(kind="gateway", source=name, actions=pending[:1000], open=open_seqs[:1000])

    def apply_reply(self, reply: DirectUploadReply) -> bool:
        """Take the controller's acknowledgement and drop the overrides the operator resolved. True when an
        override was dropped (the table's flags must be laid over again)."""
        if reply.acknowledged > self.journal.uploaded():
            self.journal.mark_uploaded(reply.acknowledged)
        resolved = {int(seq) for seq in reply.resolved}
        dropped = [key for key, o in self.overrides.items() if o["seq"] in resolved]
        for key in dropped:
            log.warning("direct: local override of %s %s by the operator", key, reply.resolved[str(self.overrides[key]["seq"])])
            del self.overrides[key]
        if dropped:
            self._save()
        return bool(dropped)

    def _save(self) -> None:
        write_atomically(self.path, json.dumps(self.overrides, sort_keys=True))


def _parse(key: str) -> Any:
    try:
        return parse_key(key)
    except FlagError as exc:
        raise BadRequest(str(exc), param=exc.field or "key") from None


def _typed(key: str, value: Any, table: RoutingTable | None) -> Any:
    spec, model = _parse(key)
    try:
        typed = coerce(spec, value)
    except FlagError as exc:
        raise BadRequest(str(exc), param="value") from None
    if spec.name == "pin":
        route = table.models.get(model or "") if table is not None else None
        if route is None or typed not in route.classes:
            known = ", ".join(sorted(route.classes)) if route is not None else "none: the model is not in the table"
            raise BadRequest(f"value: {typed} does not serve model {model} on this gateway (its revisions: {known})",
                             param="value")
    return typed


async def reason_and_value(request: Any, need_value: bool) -> tuple[Any, str | None]:
    """The body's `value` and `reason` (or the X-Fleet-Reason header)."""
    raw = await request.body()
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        raise BadRequest("body: not JSON", param="body") from None
    if not isinstance(body, dict):
        raise BadRequest("body: must be a JSON object", param="body")
    reason = body.get("reason", request.headers.get("x-fleet-reason"))
    if reason is not None and (not isinstance(reason, str) or len(reason) > 2000 or "\x00" in reason):
        raise BadRequest("reason: a string of at most 2000 characters, no NUL", param="reason")
    if need_value and "value" not in body:
        raise BadRequest("value: required", param="value")
    return body.get("value"), reason
