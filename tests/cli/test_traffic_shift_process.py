"""Ctrl-C on `fleetctl traffic shift`, as a process: the stored policy stays at the step it was on, and the
command says which, exits 130 and prints its summary. The controller runs on loopback in this process, with
a real agent loop and gateway loops (traffic_helpers.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from cli_helpers import Fleet
from traffic_helpers import MODEL, gateway, serving, wait_listed

from fleetctl.cli.exit_codes import ExitCode

REPO = Path(__file__).resolve().parents[2]
STEP_1 = {"chat@r1": 75.0, "chat@r2": 25.0}


@pytest.fixture
def served(fleet: Fleet) -> Iterator[Fleet]:
    with ExitStack() as stack:
        serving(fleet, stack, r2={"max_num_seqs": 8})  # performance only: the split is allowed
        with fleet.client() as client:
            client.set_traffic(MODEL, {"chat@r1": 1.0})
        yield fleet


class Shift:
    """`fleetctl traffic shift` in its own process, its stderr collected line by line as it comes."""

    def __init__(self, fleet: Fleet, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        env["PYTHONPATH"] = str(REPO)
        # Ctrl-C as from a terminal: a runner started in the background (`cmd &`) hands its children SIGINT
        # ignored, and Python then never raises KeyboardInterrupt; restore the default for the command.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetctl.cli.main", "--controller", fleet.server.url, "--token",
             fleet.tokens["operator"], "traffic", "shift", MODEL, "--to", "chat@r2", "--step", "25", "-o", "json", *args],
            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stderr.readline, "")), daemon=True)
        self._reader.start()

    def wait_for(self, done: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {what}: {self.lines}"
            assert time.monotonic() < deadline, f"no {what} after {timeout_s}s: {self.lines}"
            time.sleep(0.05)

    def interrupt(self) -> tuple[int, str, list[str]]:
        self.proc.send_signal(signal.SIGINT)
        stdout = self.proc.stdout.read()
        code = self.proc.wait(timeout=30)
        self._reader.join(timeout=5)
        return code, stdout, [line.rstrip("\n") for line in self.lines]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def stored(fleet: Fleet) -> dict[str, float]:
    with fleet.client() as client:
        return client.get_traffic(MODEL).weights


def test_ctrl_c_in_the_interval_leaves_the_acknowledged_step(served: Fleet) -> None:
    with gateway(served, "gw-a"):
        wait_listed(served, {"gw-a"})
        shift = Shift(served, "--interval", "10m")
        try:
            shift.wait_for(lambda: any(line.startswith("step 1/4:") for line in shift.lines), "step 1 acknowledged")
            code, stdout, lines = shift.interrupt()
        finally:
            shift.kill()
        assert stored(served) == STEP_1
    assert code == ExitCode.INTERRUPTED == 130, lines
    assert lines[-1] == (f"interrupted: traffic for {MODEL} left at step 1/4 (chat@r2 25%, chat@r1 75%), "
                         "acknowledged by every live gateway")
    assert not any("Traceback" in line for line in lines)
    summary = json.loads(stdout)
    assert (summary["result"], summary["acknowledged"], summary["planned"]) == ("interrupted", 1, 4)
    assert summary["steps"][0]["weights"] == STEP_1


def test_ctrl_c_while_a_gateway_lags_leaves_the_stored_step_and_says_it_is_not_acknowledged(served: Fleet) -> None:
    with gateway(served, "gw-stuck", stuck_at=0):
        wait_listed(served, {"gw-stuck"})
        shift = Shift(served, "--interval", "0", "--timeout", "600")
        try:
            shift.wait_for(lambda: any(line.startswith("waiting for generation") for line in shift.lines),
                           "the wait for step 1's acknowledgement")
            code, stdout, lines = shift.interrupt()
        finally:
            shift.kill()
        assert stored(served) == STEP_1
    assert code == ExitCode.INTERRUPTED, lines
    assert lines[-1] == (f"interrupted: traffic for {MODEL} left at step 1/4 (chat@r2 25%, chat@r1 75%): stored, "
                         "not yet acknowledged by every live gateway")
    assert json.loads(stdout)["acknowledged"] == 0
