"""`fleetctl --direct TARGETS ...`: break-glass without the controller. The CLI talks to agents and gateways
themselves, each on its own break-glass credential, and they record what they did in their local journals,
uploaded to the controller when it is back (`fleetctl breakglass reconcile` then asks what to keep).

TARGETS is `all` (every node of the inventory), or a comma-separated list of inventory names or URLs. The
inventory (fleetctl/inventory.py; `--inventory`, default STATE_DIR/inventory.yaml, written by `fleetctl up`)
says where each node is, what it is and where its credential file lies.

A URL not in the inventory is asked what it is (`GET /health`) and uses FLEET_DIRECT_CREDENTIAL.
Commands that work in direct mode: status, engine list|drain|stop|restart, flag set|unset, breakglass
pin|unpin|shed|kill-switch. Every other command needs the controller and says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from fleetctl.controller.paths import default_state_dir
from fleetctl.errors import AuthError, Conflict, FleetError, NotFound, Unavailable, ValidationFailed
from fleetctl.inventory import INVENTORY_FILE, read_inventory

Kind = Literal["agent", "gateway"]
CREDENTIAL_ENV = "FLEET_DIRECT_CREDENTIAL"
DIRECT_COMMANDS = "status, engine list|drain|stop|restart, flag set|unset, breakglass pin|unpin|shed|kill-switch"


@dataclass(frozen=True)
class Target:
    name: str
    kind: Kind
    url: str
    credential: str | None


def default_inventory() -> Path:
    return default_state_dir() / INVENTORY_FILE


def resolve_targets(spec: str, inventory: Path) -> list[Target]:
    nodes = read_inventory(inventory)
    wanted = [part.strip() for part in spec.split(",") if part.strip()]
    if not wanted:
        raise ValidationFailed("--direct: name the nodes (all, NAME,... or URL,...)", field="direct")
    if wanted == ["all"]:
        if not nodes:
            raise ValidationFailed(f"--direct all: no inventory at {inventory} (pass --inventory, or URLs)",
                                   field="direct")
        return [_target(node) for node in nodes]
    return [_named(item, nodes, inventory) for item in wanted]


def _named(item: str, nodes: list[dict[str, Any]], inventory: Path) -> Target:
    for node in nodes:
        if item in (node["name"], str(node["url"]).rstrip("/")):
            return _target(node)
    if not item.startswith(("http://", "https://")):
        raise NotFound(f"--direct: no node {item!r} in the inventory {inventory}", field="direct")
    url = item.rstrip("/")
    return Target(name=url, kind=_probe_kind(url), url=url, credential=os.environ.get(CREDENTIAL_ENV))


def _target(node: dict[str, Any]) -> Target:
    credential = None
    if node.get("credential_file"):
        try:
            credential = Path(node["credential_file"]).read_text().strip()
        except OSError as exc:
            raise ValidationFailed(f"inventory: node {node['name']}: cannot read {node['credential_file']} "
                                   f"({exc.strerror})", field="inventory") from None
    return Target(name=str(node["name"]), kind=node["kind"], url=str(node["url"]).rstrip("/"),
                  credential=credential or os.environ.get(CREDENTIAL_ENV))


def _probe_kind(url: str) -> Kind:
    try:
        body = httpx.get(url + "/health", timeout=3.0).json()
    except (httpx.HTTPError, ValueError):
        raise Unavailable(f"--direct {url}: unreachable, and not in the inventory to say what it is") from None
    return "agent" if "node" in body else "gateway"


class DirectFleet:
    """The targets of one `--direct` command and the calls direct mode makes on them."""

    def __init__(self, targets: list[Target], timeout_s: float):
        self.targets, self.timeout_s = targets, timeout_s

    def of(self, kind: Kind) -> list[Target]:
        found = [t for t in self.targets if t.kind == kind]
        if not found:
            raise ValidationFailed(f"--direct: none of the targets is a{'n' if kind == 'agent' else ''} {kind} "
                                   f"({', '.join(t.name for t in self.targets)})", field="direct")
        return found

    def call(self, target: Target, method: str, path: str, body: dict[str, Any] | None = None,
             auth: bool = True) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {target.credential}"} if auth and target.credential else {}
        try:
            response = httpx.request(method, target.url + path, json=body, headers=headers, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise Unavailable(f"{target.kind} {target.name} ({target.url}) unreachable: {type(exc).__name__}") from None
        try:
            payload = response.json()
        except ValueError:
            payload = {}
        if response.is_error:
            raise _refusal(target, response.status_code, payload)
        return payload

    # --- reads ---

    def status(self) -> list[dict[str, Any]]:
        return [self._status_of(t) for t in self.targets]

    def _status_of(self, target: Target) -> dict[str, Any]:
        row: dict[str, Any] = {"name": target.name, "kind": target.kind, "url": target.url}
        try:
            if target.kind == "agent":
                health = self.call(target, "GET", "/health", auth=False)
                engines = self.call(target, "GET", "/engines", auth=False)["engines"]
                direct = self.call(target, "GET", "/direct")
                row.update(reachable=True, controller="connected" if health["controller"]["connected"] else "cut off",
                           engines={e["name"]: e["state"] for e in engines}, holds=direct["holds"],
                           unuploaded=len(direct["actions"]) - direct["uploaded"])
            else:
                state = self.call(target, "GET", "/fleet/direct")
                row.update(reachable=True, generation=state["generation"], local=state["local"],
                           unuploaded=len(state["actions"]) - state["uploaded"])
        except FleetError as exc:
            row.update(reachable=False, error=exc.message)
        return row

    def engines(self) -> list[dict[str, Any]]:
        return [{**engine, "node": target.name} for target in self.of("agent")
                for engine in self.call(target, "GET", "/engines", auth=False)["engines"]]

    # --- actions ---

    def engine_action(self, name: str, action: str, reason: str | None) -> dict[str, Any]:
        """drain, stop or restart engine `name` on whichever targeted agent runs it."""
        for target in self.of("agent"):
            running = {e["name"] for e in self.call(target, "GET", "/engines", auth=False)["engines"]}
            if name in running:
                return self.call(target, "POST", f"/engines/{name}/{action}", {"reason": reason})
        raise NotFound(f"no engine {name!r} on {', '.join(t.name for t in self.of('agent'))}", field="name")

    def set_flag(self, key: str, value: Any, reason: str | None) -> list[dict[str, Any]]:
        return self._each_gateway(lambda t: self.call(t, "PUT", f"/fleet/direct/flags/{key}", {"value": value, "reason": reason}))

    def unset_flag(self, key: str, reason: str | None) -> list[dict[str, Any]]:
        return self._each_gateway(lambda t: self.call(t, "DELETE", f"/fleet/direct/flags/{key}", {"reason": reason}))

    def _each_gateway(self, act: Any) -> list[dict[str, Any]]:
        """Do `act` on every targeted gateway; if any refuses or cannot be reached, say which (after trying
        them all: a pin on two of three gateways is better than on none)."""
        done, failed = [], []
        for target in self.of("gateway"):
            try:
                done.append(act(target))
            except FleetError as exc:
                failed.append(exc)
        if failed:
            applied = ", ".join(d["name"] for d in done) or "none"
            first = failed[0]
            raise FleetError(f"{first.message} ({len(failed)} gateway(s) failed; applied on: {applied})",
                             status=first.status, code=first.code, field=first.field)
        return done


def _refusal(target: Target, status: int, payload: Any) -> FleetError:
    """An agent's (the controller's error shape) or a gateway's (OpenAI's) refusal, as the CLI's error family
    (so a wrong credential exits 4, a bad value 2, an unknown engine 3)."""
    error = payload.get("error", {}) if isinstance(payload, dict) else {}
    field = error.get("field") or error.get("param")
    code = "bad_credential" if status == 401 else error.get("code") if isinstance(error.get("code"), str) else None
    cls = {400: ValidationFailed, 401: AuthError, 404: NotFound, 409: Conflict, 422: ValidationFailed}.get(status, FleetError)
    message = f"{target.kind} {target.name}: {error.get('message') or f'HTTP {status}'}"
    return cls(message, status=422 if status == 400 else status, code=code, field=field if isinstance(field, str) else None)


def needs_controller(command: str) -> FleetError:
    return ValidationFailed(f"`fleetctl {command}` needs the controller; with --direct: {DIRECT_COMMANDS}",
                            field="direct")
