"""The planted drift: an engine started by hand with `--kv-cache-dtype bfloat16`, under a class that declares
float32, is caught. Real processes on loopback: a controller (SQLite), one agent, one reference engine.

How the hand-started engine comes under the class: the agent's own re-adoption. An agent that starts finds
the record files of engines a previous agent left running (agent/process.py, STATE_DIR/engines/NAME.json)
and takes them over; here the record is written by hand for the hand-started process, naming the engine
`hand-0` of class tiny@r1, which is what the controller assigns to the node. The record says nothing of how
the engine was launched, so the agent reports the command line the operating system shows for it, and the
engine's own `GET /v1/fleet/config` once it is ready. Both say bfloat16.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from fleet_helpers import engine_port_base, wait_until

from agent.ports import free_port
from agent.process import SOURCE_ROOT, ProcessRecord, write_record
from engine.contract import parse_samples, sum_series
from fleetctl.client import ControllerClient
from fleetctl.controller.paths import bootstrap_token_path
from fleetctl.localfleet import processes
from fleetctl.localfleet.fleet import HOST, agent_command, controller_command, controller_up

pytestmark = pytest.mark.slow

NODE = "node-1"
DECLARED = {"model": "tiny", "weights": "tiny", "kv_cache_mib": 16, "dtype": "float32", "kv_cache_dtype": "float32"}


def hand_started_engine(log_dir: Path) -> tuple[processes.ProcessInfo, int]:
    port = free_port(HOST)
    argv = [sys.executable, "-m", "engine.reference", "--model", "tiny", "--served-model-name", "tiny",
            "--port", str(port), "--kv-cache-mib", "16", "--kv-cache-dtype", "bfloat16", "--num-threads", "1",
            "--kv-side-channel-port", "-1", "--log-level", "warning"]
    info = processes.start("engine", "hand-0", argv, log_dir / "hand-0.log", url=f"http://{HOST}:{port}")
    return info, port


def engine_healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def drift_of(api: ControllerClient, name: str) -> dict | None:
    """The engine's drift once both sources are in (the command line and the engine's own report)."""
    found = [e.model_dump() for e in api.live_drift(model="tiny") if e.name == name]
    return found[0] if found and set(found[0]["checked"]) == {"engine", "launch"} else None


def test_an_engine_started_by_hand_with_another_kv_dtype_is_caught(tmp_path: Path) -> None:
    started: list[processes.ProcessInfo] = []
    controller_url = f"http://{HOST}:{free_port(HOST)}"
    argv, env = controller_command(tmp_path, int(controller_url.rsplit(":", 1)[1]), heartbeat_interval_s=1.0)
    started.append(processes.start("controller", "controller", argv, tmp_path / "controller.log", env, controller_url))
    agent_info = None
    try:
        wait_until(lambda: controller_up(controller_url), 60, "the controller")
        token_file = bootstrap_token_path(tmp_path)
        wait_until(token_file.exists, 30, "the bootstrap token")
        api = ControllerClient(controller_url, token=token_file.read_text().strip(), timeout=10.0)

        # the class and its placement: the node is registered ahead of its agent, so the engine is assigned
        # before the agent asks (it then keeps the engine it adopts instead of stopping it)
        ref = api.apply_class("tiny", DECLARED, reason="test").ref
        agent_url = f"http://{HOST}:{free_port(HOST)}"
        api.register_agent({"node": NODE, "url": agent_url, "labels": {}, "capacity": {"engines": 4, "kv_mib": 4096},
                            "agent_version": "test"})
        api.set_deployment("hand", ref, 1, reason="test")
        wait_until(lambda: [e for e in api.list_engines() if e.name == "hand-0" and e.node == NODE], 60, "hand-0 placed")

        engine, engine_port = hand_started_engine(tmp_path)
        started.append(engine)
        wait_until(lambda: engine_healthy(engine.url or ""), 240, "the hand-started engine")
        agent_state = tmp_path / "agents" / NODE
        assignment = {"name": "hand-0", "model": "tiny", "class_ref": ref, "spec": api.get_class(ref).spec, "role": "mixed"}
        write_record(agent_state / "engines", ProcessRecord(
            name="hand-0", pid=engine.pid, create_time=psutil.Process(engine.pid).create_time(), port=engine_port,
            assignment=assignment, log_path=str(tmp_path / "hand-0.log")))

        low = engine_port_base()
        agent_argv = agent_command(controller_url, NODE, str(token_file), int(agent_url.rsplit(":", 1)[1]),
                                   (low, low + 50), agent_state)
        agent_info = processes.start("agent", NODE, agent_argv, tmp_path / "agent.log", url=agent_url)
        started.append(agent_info)

        drift = wait_until(lambda: drift_of(api, "hand-0"), 90, "hand-0's command line and config reported")
        assert drift["state"] == "ready" and drift["class_ref"] == ref and drift["drifted"] is True
        kv = {(d["source"], d["declared"], d["actual"]) for d in drift["drift"] if d["field"] == "kv_cache_dtype"}
        assert kv == {("engine", "float32", "bfloat16"), ("launch", "float32", "bfloat16")}
        assert api.get_engine("hand-0").pid == engine.pid  # the agent kept the engine it adopted

        done = subprocess.run(
            [sys.executable, "-m", "fleetctl.cli.main", "--controller", controller_url, "--token", token_file.read_text().strip(),
             "class", "diff", "--live", "tiny", "-o", "json"],
            capture_output=True, text=True, timeout=120, env={"PYTHONPATH": SOURCE_ROOT, "PATH": "/usr/bin:/bin"})
        assert done.returncode == 7, done.stderr
        (reported,) = json.loads(done.stdout)
        assert reported["name"] == "hand-0" and "kv_cache_dtype" in {d["field"] for d in reported["drift"]}
        assert "hand-0" in done.stderr.splitlines()[-1]

        samples = parse_samples(api.metrics())
        assert sum_series(samples, "fleet_engine_config_drift", engine="hand-0", class_ref=ref) == 1.0
        assert api.status().drifted == 1
    finally:
        if agent_info is not None:
            processes.stop_all([agent_info], timeout_s=30)
        processes.stop_all([p for p in started if p is not agent_info], timeout_s=30)
