"""The routing benchmark's independent-engine testbed really pins its engines: each engine process, and every
thread it starts (torch's included), may run on its own CPU only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.common import Procs, start_engines


def allowed_cpus(pid: int) -> set[frozenset[int]]:
    """The CPU sets of every thread of the process."""
    return {frozenset(os.sched_getaffinity(int(task.name))) for task in Path(f"/proc/{pid}/task").iterdir()}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning two engines needs two CPUs")
def test_independent_engines_run_each_on_its_own_cpu(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    with Procs(tmp_path) as procs:
        engines = start_engines(procs, 2, "tiny", 16, 512, num_threads=1, pinned=True)
        assert [allowed_cpus(e.pid) for e in engines] == [{frozenset({cpus[0]})}, {frozenset({cpus[1]})}]
        shared = start_engines(procs, 1, "tiny", 16, 512, num_threads=1)
        assert allowed_cpus(shared[0].pid) == {frozenset(cpus)}


def test_more_pinned_engines_than_cpus_is_refused(tmp_path):
    with Procs(tmp_path) as procs, pytest.raises(ValueError, match="pinned engines need"):
        start_engines(procs, len(os.sched_getaffinity(0)) + 1, "tiny", 16, 512, pinned=True)
