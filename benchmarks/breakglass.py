"""Break-glass benchmark: what direct mode does with the control plane down, and how fast flags reach the gateways.

    .venv/bin/python benchmarks/breakglass.py [--quick] [--model smollm2|tiny] [--gateways 2] [--rps 1] [--flag-trials 30]

A local fleet on loopback (fleetctl/localfleet: a controller on SQLite, `--nodes` agents with one reference
engine each, its gateway) plus `--gateways - 1` more gateways, every gateway with direct mode on (a state
directory and its own break-glass credential) and in the fleet's inventory. Steady traffic from
../shared/traces/mooncake_conversation.jsonl (benchmarks/rollout_traffic.py) goes through all gateways in turn
from start to end. Then:

1. **Flags**: `--flag-trials` times, a random 0.1-2.1 s apart, `prefix_routing` is set (alternately off and
   on) through the API; the time from the call to each gateway routing on a table at or past the returned
   generation (GET /health `table_generation`, polled every 20 ms). Baseline, in the same trials: the call's own round trip. No
   catalog flag is read by the agents (each flag's `read_by` is the gateway or the controller), so there is no
   agent side to wait for.
2. **Through the controller** (baseline): drain one node's engines (`fleetctl engine drain`) and pin the
   model to its revision (`fleetctl breakglass pin`, which waits for every gateway); end to end until the
   agent reports the engines stopped and every gateway routes on the pin. Then the fleet is put back
   (unpin; the drained engines' replacements become ready).
3. **Direct, with the control plane down**: the controller is SIGKILLed and its database stopped (the
   SQLite files moved away, so nothing can read them); `fleetctl --direct all engine drain` for each engine
   of the node and `fleetctl --direct all breakglass pin`, end to end as in 2 (each gateway's GET
   /fleet/direct shows the pin in its flags).
4. **Back**: the database is put back and the controller started again; the time from its start until its
   audit log holds every direct action (the agents and gateways upload their journals after their first
   exchange with it, after their reconnect backoff). Then `breakglass reconcile` reverts the drains and
   adopts the pin, and the pin is lifted.

Requests lost: every request sent from the start of phase 2 to the end of phase 4 that failed (non-200,
transport error, in-band error) or was cut; count and total. Run it alone on an idle machine.
Results: a table on stdout and benchmarks/results/breakglass.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    RESULTS, BlockText, load_mooncake, log, percentile, print_table, reference_tokenizer_dir, write_json,
)
from benchmarks.rollout import start_fleet, traffic_summary  # noqa: E402
from benchmarks.rollout_traffic import TRACE, Traffic, arrival_offsets, build_requests  # noqa: E402
from fleetctl.localfleet.fleet import restart_controller  # noqa: E402

OUT = RESULTS / "breakglass.json"
GOALS = {"direct_s": 10.0, "lost": 0, "audit_s": 10.0, "flag_p99_s": 2.0}
WARM_UP_S = 10.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/breakglass.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="10 flag trials")
    p.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--gateways", type=int, default=2)
    p.add_argument("--rps", type=float, default=1.0, help="requests per second, all gateways together")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--max-prompt-tokens", type=int, default=128)
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--flag-trials", type=int)
    p.add_argument("--table-refresh-s", type=float, default=None, help="the gateways' refresh [their default]")
    p.add_argument("--heartbeat-s", type=float, default=1.0)
    p.add_argument("--outage-s", type=float, default=20.0, help="how long the controller stays down after the "
                   "direct actions (the nodes' reconnect backoff grows with it)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    args.flag_trials = args.flag_trials or (10 if args.quick else 30)
    return args


# --- the fleet ---------------------------------------------------------------------------------------------


class Fleet:
    """The local fleet, its gateways and the CLI pointed at it."""

    def __init__(self, record: Any):
        from fleetctl.client import ControllerClient

        self.record, self.state = record, Path(record.state_dir)
        self.token = Path(record.token_file).read_text().strip()
        self.api = ControllerClient(record.controller_url, self.token, timeout=10.0)
        self.gateways: dict[str, str] = {}
        self.credentials: dict[str, str] = {}  # gateway -> its break-glass credential (from the inventory)

    def add_gateways(self, count: int, refresh_s: float | None) -> None:
        from agent.ports import free_port
        from fleetctl.localfleet import processes
        from fleetctl.localfleet.fleet import gateway_command, gateway_state_dir, gateway_up, wait_for, write_local_inventory

        self.gateways = {"local-gateway": self.record.gateway_url}
        for index in range(2, count + 1):
            name, port = f"bench-gateway-{index}", free_port("127.0.0.1")
            url = f"http://127.0.0.1:{port}"
            argv = gateway_command(self.record.controller_url, port, refresh_s, gateway_state_dir(self.state, name), name)
            info = processes.start("gateway", name, argv, self.state / "logs" / f"{name}.log", {"FLEET_TOKEN": self.token}, url)
            self.record.processes.append(info)
            self.record.save()
            wait_for(lambda: gateway_up(url), info, 60.0, f"{name} to load its routing table")
            self.gateways[name] = url
        from fleetctl.inventory import read_inventory

        for node in read_inventory(write_local_inventory(self.record)):
            if node["kind"] == "gateway":
                self.credentials[node["name"]] = Path(node["credential_file"]).read_text().strip()

    def cli(self, *args: str, direct: bool = False) -> tuple[float, str]:
        """Run fleetctl; (seconds it took, stdout). Raises on a non-zero exit."""
        root = ["--controller", self.record.controller_url, "--inventory", str(self.state / "inventory.yaml")]
        root += ["--direct", "all"] if direct else []
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "fleetctl.cli.main", *root, *args], capture_output=True, text=True,
                              env={**os.environ, "FLEET_TOKEN": self.token}, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"fleetctl {' '.join(args)}: {done.stderr.strip()}")
        return time.monotonic() - start, done.stdout

    def gateway_flags(self, gateway: str) -> dict[str, Any]:
        import httpx

        url = self.gateways[gateway]
        return httpx.get(f"{url}/fleet/direct", headers={"Authorization": f"Bearer {self.credentials[gateway]}"},
                         timeout=5).json()["flags"]

    def engines_on(self, node: str) -> dict[str, str]:
        from agent.client import AgentClient

        info = next(p for p in self.record.processes if p.kind == "agent" and p.name == node)
        return {e["name"]: e["state"] for e in AgentClient(info.url).engines()}

    def ready_total(self) -> int:
        return sum(state == "ready" for node in self.nodes() for state in self.engines_on(node).values())

    def nodes(self) -> list[str]:
        return [p.name for p in self.record.processes if p.kind == "agent"]


def wait(probe: Any, timeout_s: float, what: str, every_s: float = 0.02) -> float:
    """Poll until `probe()` is truthy; the monotonic time it first was."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe():
            return time.monotonic()
        time.sleep(every_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def gateway_generation(url: str) -> int:
    import httpx

    try:
        return int(httpx.get(f"{url}/health", timeout=2).json().get("table_generation") or 0)
    except Exception:  # noqa: BLE001 - a busy gateway: poll again
        return 0


# --- the phases --------------------------------------------------------------------------------------------


def measure_flags(fleet: Fleet, trials: int) -> dict[str, Any]:
    applied, calls, rng = [], [], random.Random(14)
    for trial in range(trials):
        start = time.monotonic()
        result = fleet.api.set_flag("prefix_routing", trial % 2 == 1, reason="benchmark")
        calls.append(time.monotonic() - start)
        for url in fleet.gateways.values():
            done = wait(lambda u=url: gateway_generation(u) >= (result.generation or 0), 30, "a gateway to apply the flag")
            applied.append(done - start)
        # a random gap, so a trial does not start in step with the gateways' refresh timers (each trial
        # ends at a refresh: a fixed gap would measure the same phase of the refresh period every time)
        time.sleep(rng.uniform(0.1, 2.1))
    fleet.api.unset_flag("prefix_routing", reason="benchmark")
    return {"trials": trials, "gateways": len(fleet.gateways), "applied_s": applied, "call_s": calls,
            "applied_p50_s": percentile(applied, 50), "applied_p99_s": percentile(applied, 99), "applied_max_s": max(applied),
            "call_p99_s": percentile(calls, 99), "ratio_p99": percentile(applied, 99) / percentile(calls, 99)}


def drain_node_and_pin(fleet: Fleet, node: str, model: str, class_ref: str, direct: bool) -> dict[str, Any]:
    """Drain every engine of `node` and pin `model`, through the controller or directly; end to end."""
    engines = sorted(name for name, state in fleet.engines_on(node).items() if state == "ready")
    start = time.monotonic()
    commands = []
    for engine in engines:
        extra = [] if direct else ["--no-wait"]
        commands.append(fleet.cli("engine", "drain", engine, "--reason", "benchmark", "--yes", *extra, direct=direct)[0])
    commands.append(fleet.cli("breakglass", "pin", model, class_ref, "--reason", "benchmark", "--yes", direct=direct)[0])
    stopped = wait(lambda: all(fleet.engines_on(node).get(e) in (None, "stopped", "failed") for e in engines), 120,
                   "the drained engines to stop", every_s=0.1)
    pinned = wait(lambda: all(fleet.gateway_flags(g).get(f"pin:{model}") == class_ref for g in fleet.gateways), 60,
                  "every gateway to route on the pin", every_s=0.05)
    return {"engines": engines, "commands_s": commands, "end_to_end_s": max(stopped, pinned) - start,
            "drained_s": stopped - start, "pinned_s": pinned - start}


def stop_database(state: Path) -> list[Path]:
    moved = []
    for path in sorted(state.glob("fleet.db*")):
        target = path.with_name(path.name + ".stopped")
        path.rename(target)
        moved.append(target)
    return moved


def start_database(moved: list[Path]) -> None:
    for path in moved:
        path.rename(path.with_name(path.name.removesuffix(".stopped")))


def kill_controller(fleet: Fleet) -> None:
    import signal

    from fleetctl.localfleet import processes

    info = next(p for p in fleet.record.processes if p.kind == "controller")
    os.kill(info.pid, signal.SIGKILL)
    wait(lambda: processes.exit_status(info) is not None or not processes.is_running(info), 10, "the controller to die")


def direct_actions_in_audit(fleet: Fleet) -> int:
    try:
        return sum(1 for e in fleet.api.list_audit(limit=10_000) if e.actor.startswith("direct:"))
    except Exception:  # noqa: BLE001 - the controller is still starting
        return -1


def journal_entries(fleet: Fleet) -> int:
    journals = list(fleet.state.glob("agents/*/direct/direct-actions.jsonl")) + list(fleet.state.glob("gateway*/direct-actions.jsonl"))
    return sum(len(path.read_text().splitlines()) for path in journals)


def converge(fleet: Fleet, replicas: int, timeout_s: float = 600.0) -> None:
    wait(lambda: fleet.ready_total() >= replicas and not fleet.api.divergence(), timeout_s, "the fleet to converge",
         every_s=0.5)


def measure(args: argparse.Namespace, record: Any) -> dict[str, Any]:
    fleet = Fleet(record)
    fleet.add_gateways(args.gateways, args.table_refresh_s)
    (deployment,) = fleet.api.list_deployments()
    model, class_ref = record.served_model, deployment.class_ref
    blocks = BlockText(reference_tokenizer_dir(), args.block_tokens)
    requests = build_requests(blocks, args.block_tokens, args.max_prompt_tokens, args.max_tokens, limit=4000)
    offsets = arrival_offsets(load_mooncake(TRACE)[:4000], args.rps, "steady")
    traffic = Traffic(list(fleet.gateways.values()), model, requests, offsets).start()
    try:
        time.sleep(WARM_UP_S)
        log(f"flags: {args.flag_trials} trials over {len(fleet.gateways)} gateways")
        flags = measure_flags(fleet, args.flag_trials)
        actions_start = time.monotonic()
        log("through the controller: drain node-1, pin the model")
        via_controller = drain_node_and_pin(fleet, "node-1", model, class_ref, direct=False)
        fleet.cli("breakglass", "unpin", model, "--reason", "benchmark")
        wait(lambda: fleet.ready_total() >= args.nodes, 600, "the replacements", every_s=0.5)
        node = max(fleet.nodes(), key=lambda n: sum(s == "ready" for s in fleet.engines_on(n).values()))
        if sum(s == "ready" for s in fleet.engines_on(node).values()) >= fleet.ready_total():
            node = min(fleet.nodes(), key=lambda n: sum(s == "ready" for s in fleet.engines_on(n).values()))
        log(f"direct: controller killed, database stopped; drain {node}, pin the model")
        kill_controller(fleet)
        moved = stop_database(fleet.state)
        direct = drain_node_and_pin(fleet, node, model, class_ref, direct=True)
        entries = journal_entries(fleet)
        time.sleep(args.outage_s)
        start_database(moved)
        started = time.monotonic()
        restart_controller(record, heartbeat_interval_s=args.heartbeat_s)
        audited_at = wait(lambda: direct_actions_in_audit(fleet) >= entries, 120, "the direct actions in the audit",
                          every_s=0.1)
        divergence = fleet.api.divergence()
        drains = [d.id for d in divergence if d.kind == "agent"]
        pins = [d.id for d in divergence if d.kind == "gateway"]
        fleet.api.reconcile(adopt=pins, revert=drains, reason="benchmark")
        fleet.cli("breakglass", "unpin", model, "--reason", "benchmark")
        converge(fleet, args.nodes)
        actions_end = time.monotonic()
    finally:
        traffic.stop()
    window = traffic_summary(traffic.between(actions_start, actions_end))
    report = {
        "benchmark": "breakglass", "command": "benchmarks/breakglass.py " + " ".join(sys.argv[1:]),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_1m_end": os.getloadavg()[0]},
        "flags": flags, "via_controller": via_controller, "direct": direct,
        "direct_over_controller": direct["end_to_end_s"] / via_controller["end_to_end_s"],
        "audit": {"direct_actions": entries, "divergences": len(divergence), "outage_s": args.outage_s,
                  "from_controller_start_s": audited_at - started},
        "requests": window, "whole_run": traffic_summary(traffic.results),
    }
    report["goals"] = judge(report)
    return report


def judge(report: dict[str, Any]) -> list[dict[str, Any]]:
    lost = report["requests"]["failed"] + report["requests"]["cut"]
    rows = [("direct drain + pin, end to end (s)", report["direct"]["end_to_end_s"], f"< {GOALS['direct_s']:g}",
             report["direct"]["end_to_end_s"] < GOALS["direct_s"]),
            ("requests lost (of sent)", f"{lost} of {report['requests']['requests']}", "0", lost == 0),
            ("audit holds every direct action (s from controller start)", report["audit"]["from_controller_start_s"],
             f"< {GOALS['audit_s']:g}", report["audit"]["from_controller_start_s"] < GOALS["audit_s"]),
            ("flag set -> every gateway applied, p99 (s)", report["flags"]["applied_p99_s"], f"< {GOALS['flag_p99_s']:g}",
             report["flags"]["applied_p99_s"] < GOALS["flag_p99_s"])]
    return [{"figure": f, "value": v, "goal": g, "met": m} for f, v, g, m in rows]


def print_report(report: dict[str, Any]) -> None:
    rows = [{"figure": g["figure"], "value": f"{g['value']:.2f}" if isinstance(g["value"], float) else g["value"],
             "goal": g["goal"], "met": "yes" if g["met"] else "NO"} for g in report["goals"]]
    rows.append({"figure": "via the controller, end to end (s)", "value": f"{report['via_controller']['end_to_end_s']:.2f}",
                 "goal": "baseline", "met": ""})
    rows.append({"figure": "direct / via the controller", "value": f"{report['direct_over_controller']:.2f}x",
                 "goal": "", "met": ""})
    rows.append({"figure": "flag apply p99 / API call p99", "value": f"{report['flags']['ratio_p99']:.1f}x",
                 "goal": "", "met": ""})
    print_table(rows, [("figure", "figure", ""), ("value", "value", ""), ("goal", "goal", ""), ("met", "met", "")])


def main(argv: list[str] | None = None) -> None:
    from fleetctl.localfleet import down

    args = parse_args(argv)
    state_dir = Path(tempfile.mkdtemp(prefix="fleet-breakglass-bench-"))
    log(f"fleet state and logs: {state_dir}")
    record = start_fleet(args, state_dir)  # it reads nodes, model, heartbeat_s and table_refresh_s
    try:
        report = measure(args, record)
    finally:
        log("stopping the fleet")
        down(state_dir, timeout_s=30.0)
    write_json(args.out, report)
    print_report(report)


if __name__ == "__main__":
    main()
