"""Engine processes: spawning one (its output appended to a log file), watching it, signalling it, and the small
record file that lets a restarted agent re-adopt it.

A process is either a child this agent spawned (`subprocess.Popen`: exact exit status) or one a previous agent
spawned and this one re-adopted (`psutil`: the exit status is not ours to collect). Both are identified by
PID *and* creation time, so a recycled PID is never mistaken for an engine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

import engine

# The directory that holds the `engine` and `agent` packages, so `python -m engine.reference` works from a
# source checkout that is not pip-installed.
SOURCE_ROOT = str(Path(engine.__file__).resolve().parent.parent)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ManagedProcess:
    """One OS process the agent (or the local fleet) manages."""

    def __init__(self, pid: int, create_time: float, popen: subprocess.Popen | None = None):
        self.pid = pid
        self.create_time = create_time
        self._popen = popen

    @property
    def adopted(self) -> bool:
        return self._popen is None

    def poll(self) -> str | None:
        """None while it runs; once it has ended, how: 'exit 0', 'exit 1', 'signal SIGKILL', 'exited'."""
        if self._popen is not None:
            code = self._popen.poll()
            return None if code is None else describe_exit(code)
        return None if is_alive(self.pid, self.create_time) else "exited"

    def send(self, sig: signal.Signals) -> None:
        """Signal the engine's whole process group (it leads its own session), ignoring one already gone."""
        if self.poll() is not None:
            return
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


def spawn(argv: list[str], env: dict[str, str], log_path: Path, without: Iterable[str] = ()) -> ManagedProcess:
    """Start `argv` in its own session (a Ctrl-C to the agent's terminal does not reach it), output to the log.
    Its environment is `child_env(env, without)`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        popen = subprocess.Popen(
            argv, env=child_env(env, without), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return ManagedProcess(popen.pid, _create_time(popen.pid), popen)


def child_env(extra: dict[str, str], without: Iterable[str] = ()) -> dict[str, str]:
    """The agent's environment less the names in `without`, plus `extra`, with the source root on PYTHONPATH."""
    dropped = set(without)
    inherited = {name: value for name, value in os.environ.items() if name not in dropped}
    return {**inherited, **agent_set_env(extra)}


def agent_set_env(extra: dict[str, str]) -> dict[str, str]:
    """The variables the agent itself sets for an engine (what it reports as launched): `extra` and PYTHONPATH."""
    merged = {**os.environ, **extra}
    pythonpath = os.pathsep.join(p for p in (SOURCE_ROOT, merged.get("PYTHONPATH")) if p)
    return {**extra, "PYTHONPATH": pythonpath}


def command_line(pid: int) -> list[str]:
    """The command line of a running process ([] when it cannot be read): what an adopted engine runs."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit {returncode}"


def _create_time(pid: int) -> float:
    try:
        return start_time(psutil.Process(pid))
    except psutil.Error:
        return 0.0


def start_time(proc: psutil.Process) -> float:
    """When the process started, in seconds since boot (Linux: /proc/PID/stat's starttime), else psutil's
    create_time(). The wall-clock create_time() is boot time + that, and the boot time the kernel reports moves
    whenever the wall clock is stepped (a VM's clock is, now and then): after a long run a process would no
    longer match its own record, and `fleetctl down` would leave it running."""
    try:
        with open(f"/proc/{proc.pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
        return int(fields[19]) / CLOCK_TICKS  # field 22 of stat(5), counted from its 3rd
    except (OSError, IndexError, ValueError):
        return proc.create_time()


def is_alive(pid: int, create_time: float) -> bool:
    """Whether that very process (PID and start time: start_time, or the wall-clock create_time of records
    written before) still runs; a zombie does not."""
    try:
        proc = psutil.Process(pid)
        same = create_time in (start_time(proc), proc.create_time())
        return same and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# --- record files: <state_dir>/engines/<name>.json, a cache for re-adoption, never the source of truth ---


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    create_time: float
    port: int
    assignment: dict[str, Any]
    log_path: str
    restarts: int = 0
    launched: dict[str, Any] | None = None  # LaunchedCommand JSON; None in records of older agents


def write_record(directory: Path, record: ProcessRecord) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{record.name}.json.tmp"
    tmp.write_text(json.dumps(asdict(record)))
    tmp.replace(directory / f"{record.name}.json")


def remove_record(directory: Path, name: str) -> None:
    (directory / f"{name}.json").unlink(missing_ok=True)


def read_records(directory: Path) -> list[ProcessRecord]:
    """Every readable record; unreadable ones are skipped (they are a cache)."""
    records = []
    for path in sorted(directory.glob("*.json")):
        try:
            records.append(ProcessRecord(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return records


def adopt(record: ProcessRecord) -> ManagedProcess | None:
    """The recorded process, if that very process (same PID and creation time) still runs."""
    return ManagedProcess(record.pid, record.create_time) if is_alive(record.pid, record.create_time) else None
