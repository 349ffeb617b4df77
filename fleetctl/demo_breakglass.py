"""The demo's break-glass step: the control plane goes down and the operator still acts.

The controller is stopped; `fleetctl --direct all` drains an engine on its agent and pins the model on the
gateway, each on that node's own break-glass credential (the inventory `fleetctl up` wrote); a question is
still answered. The controller is started again: the agents and the gateway upload their direct-action
journals, the audit log shows what was done (actor `direct:NODE`), and `breakglass divergence` lists what
differs from desired state; `breakglass reconcile` reverts the drain and adopts the pin, which is then lifted.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from fleetctl.client import ControllerClient
from fleetctl.errors import FleetError
from fleetctl.localfleet import processes
from fleetctl.localfleet.fleet import FleetRecord, restart_controller


def run_breakglass(fleet: dict[str, Any], run: Callable[[list[str]], None],
                   ask: Callable[[str], str]) -> bool:
    state_dir = Path(fleet["state_dir"])
    record = FleetRecord.load(state_dir)
    model = record.served_model
    with ControllerClient(record.controller_url, Path(record.token_file).read_text().strip(), timeout=10.0) as api:
        ready = [e for e in api.list_engines() if e.state == "ready" and not e.drain]
    if len(ready) < 2:
        print("\nbreak-glass step skipped: it drains one engine, and fewer than two are ready")
        return False
    engine, class_ref = ready[0].name, ready[1].class_ref  # drain one; pin to what another one serves
    print("\n== break-glass: the control plane is down, the operator still acts ==", flush=True)
    controller = next(p for p in record.processes if p.kind == "controller")
    processes.stop_all([controller], timeout_s=20.0)
    print(f"controller stopped (pid {controller.pid}); the gateway and agents keep serving on what they have")
    direct = ["--inventory", str(state_dir / "inventory.yaml"), "--direct", "all"]
    run([*direct, "engine", "drain", engine, "--reason", "demo: bad host", "--yes"])
    run([*direct, "breakglass", "pin", model, class_ref, "--reason", "demo: known-good revision", "--yes"])
    run([*direct, "status"])
    print(f"\nasking with the controller down: {ask('Say hello in French.')}")
    restart_controller(record)
    print("\ncontroller started again; the nodes upload their journals at their next exchange with it")
    with ControllerClient(record.controller_url, Path(record.token_file).read_text().strip(), timeout=10.0) as api:
        divergences = _wait_divergences(api, 2, 60.0)
        run(["audit", "list", "--actor", "direct:node-1"])
        run(["audit", "list", "--actor", "direct:gw:local-gateway"])
        run(["breakglass", "divergence"])
        drains = [str(d.id) for d in divergences if d.kind == "agent"]
        pins = [str(d.id) for d in divergences if d.kind == "gateway"]
        if not drains or not pins:
            print("the direct actions did not reach the controller within 60 s")
            return False
        run(["breakglass", "reconcile", *[a for i in drains for a in ("--revert", i)],
             *[a for i in pins for a in ("--adopt", i)], "--reason", "demo: host fixed, keep the pin", "--yes"])
        run(["breakglass", "unpin", model, "--reason", "demo: incident over"])
    return True


def _wait_divergences(api: ControllerClient, count: int, timeout_s: float) -> list[Any]:
    deadline, found = time.monotonic() + timeout_s, []
    while time.monotonic() < deadline:
        try:
            found = api.divergence()
        except FleetError:
            found = []
        if len(found) >= count:
            return found
        time.sleep(0.5)
    return found
