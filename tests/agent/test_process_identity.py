"""A process is known by its PID and its start time, counted from boot, so that a stepped wall clock (which
moves psutil's create_time) does not make a running process look gone to `fleetctl down` or the agent."""

from __future__ import annotations

import subprocess
import sys

import psutil

from agent.process import is_alive, start_time


def test_a_running_process_matches_its_start_time_and_an_older_wall_clock_record() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        proc = psutil.Process(child.pid)
        since_boot = start_time(proc)
        assert 0 < since_boot < proc.create_time()  # seconds since boot, not since the epoch
        assert is_alive(child.pid, since_boot)
        assert is_alive(child.pid, proc.create_time())  # a record written as wall-clock time still matches
        assert not is_alive(child.pid, since_boot + 0.5)  # another process that got the same PID
    finally:
        child.kill()
        child.wait()
    assert not is_alive(child.pid, since_boot)
