"""The local fleet's processes: start one (a `fleetctl ...` command in its own session, output to a log),
remember it by PID and creation time, stop it (SIGTERM, then SIGKILL after a timeout).

PID plus creation time identifies a process: a PID the OS has recycled for something else is never signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from agent.process import ManagedProcess, child_env, describe_exit, is_alive, start_time


@dataclass(frozen=True)
class ProcessInfo:
    """One process of the fleet. `kind`: controller | agent | engine | gateway."""

    kind: str
    name: str
    pid: int
    create_time: float
    url: str | None = None
    log_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def fleetctl_argv(*args: str) -> list[str]:
    """`fleetctl ARGS` with this interpreter, working whether or not the console script is installed."""
    return [sys.executable, "-m", "fleetctl.cli.main", *args]


def start(kind: str, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None,
          url: str | None = None) -> ProcessInfo:
    """Start `argv` in its own session, so a Ctrl-C at the terminal reaches `fleetctl up` only, which then
    stops everything in order."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        popen = subprocess.Popen(argv, env=child_env(env or {}), stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    return ProcessInfo(kind, name, popen.pid, start_time(psutil.Process(popen.pid)), url, str(log_path))


def is_running(info: ProcessInfo) -> bool:
    return is_alive(info.pid, info.create_time)


def exit_status(info: ProcessInfo) -> str | None:
    """How a child of this process ended ('exit 1', 'signal SIGKILL'), None while it runs; reaps it."""
    try:
        pid, status = os.waitpid(info.pid, os.WNOHANG)
    except ChildProcessError:  # not our child (started by another `fleetctl up`): no status to collect
        return None if is_running(info) else "exited"
    return None if pid == 0 else describe_exit(os.waitstatus_to_exitcode(status))


def stop_all(processes: list[ProcessInfo], timeout_s: float) -> dict[str, str]:
    """SIGTERM every process, wait up to `timeout_s` for all of them, SIGKILL the rest.
    Returns name -> 'stopped' | 'killed' | 'not running'."""
    outcome = {p.name: "not running" for p in processes}
    live = [p for p in processes if is_running(p)]
    for info in live:
        _signal(info, signal.SIGTERM)
        outcome[info.name] = "stopped"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive_reaping(p) for p in live):
        time.sleep(0.1)
    for info in live:
        if _alive_reaping(info):
            _signal(info, signal.SIGKILL)
            outcome[info.name] = "killed"
    return outcome


def _alive_reaping(info: ProcessInfo) -> bool:
    exit_status(info)  # reap our own children so they do not linger as zombies
    return is_running(info)


def _signal(info: ProcessInfo, sig: signal.Signals) -> None:
    """Signal the process's group (each fleet process leads its own session), if it is still that process."""
    ManagedProcess(info.pid, info.create_time).send(sig)
