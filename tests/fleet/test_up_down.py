"""`fleetctl up` / `fleetctl down` and the agent commands, run as a user runs them: the real CLI in
subprocesses, checking stdout, stderr and exit codes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from fleet_helpers import engine_port_base, wait_until

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.localfleet import down

pytestmark = pytest.mark.slow


def fleetctl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetctl.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def up_args(state_dir: Path, *extra: str) -> list[str]:
    return ["up", "--model", "tiny", "--nodes", "1", "--state-dir", str(state_dir), "--controller-port", "0",
            "--gateway-port", "0", "--engine-port-base", str(engine_port_base()), *extra]


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """A state dir for a CLI-started fleet; whatever the test did, the fleet in it is stopped afterwards."""
    yield tmp_path
    if (tmp_path / "fleet.json").exists():
        down(tmp_path, timeout_s=30.0)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_up_detach_then_down_stops_everything(state_dir):
    result = fleetctl(*up_args(state_dir, "--detach", "-o", "json"))
    assert result.returncode == 0, result.stderr
    fleet = json.loads(result.stdout)
    assert "engines: 1/1 ready" in result.stderr  # progress went to stderr
    [engine] = fleet["engines"]
    assert engine["state"] == "ready"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert httpx.post(f"{engine['url']}/v1/chat/completions", json=body, timeout=60).status_code == 200
    through_gateway = httpx.post(f"{fleet['gateway_url']}/v1/chat/completions", json=body, timeout=60)
    assert through_gateway.status_code == 200
    assert through_gateway.headers["x-fleet-served-by"].endswith(engine["name"])
    pids = [p["pid"] for p in fleet["processes"]] + [engine["pid"]]
    assert all(alive(pid) for pid in pids)
    gateway = next(p for p in fleet["processes"] if p["kind"] == "gateway")
    assert "--engines-share-hardware" in psutil.Process(gateway["pid"]).cmdline()  # every engine on this host's CPUs

    again = fleetctl(*up_args(state_dir, "--detach"))  # one fleet per state dir
    assert again.returncode == ExitCode.REFUSED and "already up" in again.stderr

    status = fleetctl("--controller", fleet["controller_url"], "--token",
                      Path(fleet["token_file"]).read_text().strip(), "status", timeout=60)
    assert status.returncode == 0 and "local-0" in status.stdout

    agent = next(p for p in fleet["processes"] if p["kind"] == "agent")
    listed = fleetctl("agent", "engines", "--agent", agent["url"], timeout=60)
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["name"] == "local-0"
    (state_dir / "wrong-token").write_text("wrong\n")
    refused = fleetctl("agent", "stop", "local-0", "--agent", agent["url"], "--admin-token-file",
                       str(state_dir / "wrong-token"), timeout=60)
    assert refused.returncode == ExitCode.AUTH and "break-glass credential" in refused.stderr
    assert "--admin-token-file" in refused.stderr  # the fix is the node's file, not a controller token

    os.kill(agent["pid"], signal.SIGKILL)  # an agent that dies cannot stop its engine: `down` sweeps it
    down = fleetctl("down", "--state-dir", str(state_dir), "-o", "json")
    assert down.returncode == 0, down.stderr
    report = {row["name"]: row for row in json.loads(down.stdout)}
    assert report["local-0"]["kind"] == "engine" and report["local-0"]["result"] == "stopped"
    assert report["controller"]["result"] == "stopped"
    wait_until(lambda: not any(alive(pid) for pid in pids), 30, "every process to be gone")
    assert not (state_dir / "fleet.json").exists()

    nothing = fleetctl("down", "--state-dir", str(state_dir))
    assert nothing.returncode == 0 and "nothing to stop" in nothing.stderr


def test_up_in_the_foreground_stops_everything_on_ctrl_c(state_dir):
    # Ctrl-C as from a terminal: a runner started in the background (`cmd &`) hands its children SIGINT
    # ignored, and Python then never raises KeyboardInterrupt; restore the default for the fleet under test.
    proc = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", *up_args(state_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: (state_dir / "fleet.json").exists() and json.loads((state_dir / "fleet.json").read_text())["engines"],
                   240, "the fleet to be up")
        fleet = json.loads((state_dir / "fleet.json").read_text())
        pids = [p["pid"] for p in fleet["processes"]] + [e["pid"] for e in fleet["engines"]]
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "local fleet up" in stdout and "local fleet stopped" in stderr
    assert not any(alive(pid) for pid in pids)


def test_up_refuses_a_busy_controller_port(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = fleetctl("up", "--model", "tiny", "--state-dir", str(tmp_path), "--controller-port", str(port))
    assert result.returncode == ExitCode.REFUSED
    assert f"controller port {port} is taken" in result.stderr and result.stdout == ""


def test_up_that_times_out_says_where_to_look_and_stops_what_it_started(state_dir):
    result = fleetctl(*up_args(state_dir, "--detach", "--timeout", "0.5"))
    assert result.returncode == ExitCode.ERROR
    assert "engines not ready after" in result.stderr and "/agents/*/logs" in result.stderr
    assert "stopping what was started" in result.stderr
    assert not (state_dir / "fleet.json").exists()  # `down` ran


def test_up_with_a_broken_controller_names_its_log(state_dir):
    (state_dir / "fleet.db").write_text("this is not a database")
    result = fleetctl(*up_args(state_dir, "--detach"))
    assert result.returncode == ExitCode.ERROR
    assert "controller controller exited" in result.stderr and "controller.log" in result.stderr
    assert not (state_dir / "fleet.json").exists()


def test_down_with_an_unreadable_record_fails_clearly(tmp_path):
    (tmp_path / "fleet.json").write_text("{}")
    result = fleetctl("down", "--state-dir", str(tmp_path))
    assert result.returncode == ExitCode.ERROR and "is not a fleet record" in result.stderr


@pytest.mark.parametrize(("flags", "message"), [
    (["--port-range", "9000-8000"], "port range"),
    (["--label", "no-equals-sign"], "KEY=VALUE"),
    (["--token-file", "EMPTY"], "is empty"),
])
def test_agent_serve_rejects_bad_flags(tmp_path, flags, message):
    (tmp_path / "EMPTY").write_text("")
    flags = [str(tmp_path / f) if f == "EMPTY" else f for f in flags]
    result = fleetctl("agent", "serve", "--node", "n1", "--state-dir", str(tmp_path), *flags)
    assert result.returncode == ExitCode.USAGE and message in result.stderr


def test_agent_serve_refuses_a_busy_api_port(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = fleetctl("agent", "serve", "--node", "n1", "--state-dir", str(tmp_path), "--port", str(port),
                          "--controller", "http://127.0.0.1:9", timeout=60)
    assert result.returncode == ExitCode.REFUSED and f"127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_agent_break_glass_against_no_agent_is_unavailable(tmp_path):
    (tmp_path / "token").write_text("t\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        result = fleetctl("agent", "drain", "e-0", "--agent", f"http://127.0.0.1:{port}",
                          "--admin-token-file", str(tmp_path / "token"), timeout=60)
    assert result.returncode == ExitCode.UNAVAILABLE and "unreachable" in result.stderr


def test_engine_serve_passes_its_arguments_through():
    result = fleetctl("engine", "serve", "--model", "no-such-model", timeout=60)
    assert result.returncode == 2 and "--model" in result.stderr  # argparse of engine.reference answered
