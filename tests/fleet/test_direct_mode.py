"""Direct mode, end to end on a real local fleet (controller, two agents with tiny engines, a gateway):
with the controller killed and its SQLite store moved away, `fleetctl --direct` drains an engine on an agent
and pins the model on the gateway, requests through the gateway are all still answered, and one node's
credential is refused by another. When the controller is back, the direct actions are in its audit log and
reported as divergences, not undone; `breakglass reconcile` reverts the drain (the engine comes back) and
adopts the pin (the controller now serves it, the gateway drops its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fleet_helpers import (
    Traffic, controller, converged, engines_by_name, kill, process, restart_controller, wait_until,
)

from fleetctl.localfleet import FleetRecord

pytestmark = pytest.mark.slow


def fleetctl(record: FleetRecord, *args: str, direct: str | None = "all") -> subprocess.CompletedProcess[str]:
    root = ["--controller", record.controller_url, "--inventory", str(Path(record.state_dir) / "inventory.yaml")]
    if direct is not None:
        root += ["--direct", direct]
    env = {**os.environ, "FLEET_TOKEN": Path(record.token_file).read_text().strip()}
    return subprocess.run([sys.executable, "-m", "fleetctl.cli.main", *root, *args], capture_output=True, text=True,
                          env=env, timeout=60)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def credential(record: FleetRecord, node: str) -> str:
    return (Path(record.state_dir) / "agents" / node / "admin-token").read_text().strip()


def test_direct_mode_works_with_the_control_plane_down_and_is_reconciled_after(tiny_fleet: FleetRecord):
    wait_until(lambda: converged(tiny_fleet, replicas=2), 90, "2 ready engines")
    on_node_1 = next(name for name, e in engines_by_name(tiny_fleet).items() if e["node"] == "node-1")
    with controller(tiny_fleet) as api:
        (deployment,) = api.list_deployments()
    class_ref, model, gateway = deployment.class_ref, tiny_fleet.served_model, tiny_fleet.gateway_url or ""
    store = Path(tiny_fleet.state_dir) / "fleet.db"

    with Traffic([gateway]) as traffic:  # the fleet serves `tiny`, the model `complete` asks for
        kill(process(tiny_fleet, "controller"))
        for suffix in ("", "-wal", "-shm"):  # the database is stopped too: nothing may read it
            if Path(f"{store}{suffix}").exists():
                Path(f"{store}{suffix}").rename(f"{store}{suffix}.stopped")
        refused = fleetctl(tiny_fleet, "deploy", "list")
        assert refused.returncode != 0 and "needs the controller" in refused.stderr and "Traceback" not in refused.stderr

        ok(fleetctl(tiny_fleet, "engine", "drain", on_node_1, "--reason", "bad host", "--yes"))
        ok(fleetctl(tiny_fleet, "breakglass", "pin", model, class_ref, "--reason", "known good", "--yes"))
        wait_until(lambda: engines_by_name(tiny_fleet)[on_node_1]["state"] == "stopped", 60,
                   "the drained engine to stop")
        served = traffic.ok
        wait_until(lambda: traffic.ok >= served + 10, 60, "requests answered with the controller down")

        status = json.loads(ok(fleetctl(tiny_fleet, "status", "-o", "json")))
        by_name = {row["name"]: row for row in status}
        assert by_name["node-1"]["holds"] == {on_node_1: 1} and by_name["node-1"]["controller"] == "cut off"
        assert by_name["local-gateway"]["local"][f"pin:{model}"]["value"] == class_ref

        # one node's credential means nothing to another
        node_2 = process(tiny_fleet, "agent", "node-2").url
        other = httpx.get(f"{node_2}/direct", headers={"Authorization": f"Bearer {credential(tiny_fleet, 'node-1')}"})
        assert other.status_code == 401
        at_gateway = httpx.get(f"{gateway}/fleet/direct", headers={"Authorization": f"Bearer {credential(tiny_fleet, 'node-1')}"})
        assert at_gateway.status_code == 401
        inventory = Path(tiny_fleet.state_dir) / "inventory.yaml"
        crossed = inventory.read_text().replace("agents/node-2/admin-token", "agents/node-1/admin-token")
        (Path(tiny_fleet.state_dir) / "crossed.yaml").write_text(crossed)
        on_node_2 = next(name for name, e in engines_by_name(tiny_fleet).items() if e["node"] == "node-2")
        wrong = subprocess.run([sys.executable, "-m", "fleetctl.cli.main", "--inventory",
                                str(Path(tiny_fleet.state_dir) / "crossed.yaml"), "--direct", "node-2", "engine", "drain",
                                on_node_2, "--reason", "x", "--yes"], capture_output=True, text=True, timeout=60)
        assert wrong.returncode == 4 and "break-glass credential is not valid" in wrong.stderr, wrong.stderr
        assert engines_by_name(tiny_fleet)[on_node_2]["state"] == "ready"  # refused: nothing done

        for suffix in ("", "-wal", "-shm"):
            if Path(f"{store}{suffix}.stopped").exists():
                Path(f"{store}{suffix}.stopped").rename(f"{store}{suffix}")
        restart_controller(tiny_fleet)

        def audited() -> list[str]:
            with controller(tiny_fleet) as api:
                actions = [e.action for e in api.list_audit(actor=None, limit=1000) if e.actor.startswith("direct:")]
            return actions if {"direct.drain", "direct.flag.set"} <= set(actions) else []

        wait_until(audited, 90, "the direct actions in the controller's audit log")
        with controller(tiny_fleet) as api:
            divergent = wait_until(lambda: len(api.divergence()) == 2 and api.divergence(), 30, "two divergences")
        drain = next(d for d in divergent if d.action == "drain")
        pin = next(d for d in divergent if d.action == "flag.set")
        assert (drain.source, drain.target, drain.desired) == ("node-1", on_node_1, "run")
        assert (pin.target, pin.value, pin.desired) == (f"pin:{model}", class_ref, None)
        time.sleep(4)  # several reconcile passes and heartbeats: the drain is reported, not undone
        assert engines_by_name(tiny_fleet)[on_node_1]["state"] == "stopped"

        ok(fleetctl(tiny_fleet, "breakglass", "reconcile", "--revert", str(drain.id), "--adopt", str(pin.id),
                    "--reason", "host fixed; keep the pin", "--yes", direct=None))
        wait_until(lambda: engines_by_name(tiny_fleet)[on_node_1]["state"] == "ready", 90, "the reverted drain's engine")
        with controller(tiny_fleet) as api:
            assert api.get_flag(f"pin:{model}").value == class_ref  # adopted: the controller's own now
            assert api.divergence() == []
        state = lambda: httpx.get(f"{gateway}/fleet/direct", headers={  # noqa: E731
            "Authorization": f"Bearer {(Path(tiny_fleet.state_dir) / 'gateway' / 'breakglass_token').read_text().strip()}"}).json()
        wait_until(lambda: state()["local"] == {}, 30, "the gateway to drop its adopted override")
        assert state()["flags"][f"pin:{model}"] == class_ref
        ok(fleetctl(tiny_fleet, "breakglass", "unpin", model, "--reason", "incident over", direct=None))
    assert traffic.failed == [] and traffic.ok > 0
    wait_until(lambda: converged(tiny_fleet, replicas=2), 90, "the fleet to converge")
