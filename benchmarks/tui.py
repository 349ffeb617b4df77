"""Live-view benchmark: what the change stream costs the controller per connected viewer, and how long
`fleetctl tui` takes to show its first full screen, on a 1,000-node, 4,000-engine fleet whose metrics change
every second.

    .venv/bin/python benchmarks/tui.py [--nodes 1000] [--engines-per-node 4] [--viewers 0,1,10,50] [--window 20]

A controller process (`fleetctl controller serve`, SQLite, its own state dir; benchmarks/controller_scale.py
starts it) holds the fleet: `--nodes` nodes register through the API and report their engines in one
heartbeat each. Then a writer thread in this process stands in for the agents: every second it rewrites
every engine's metrics (growing counters, moving gauges) in the controller's database in one transaction.
Through the API that would be 1,000 heartbeats a second, more than this 2-core machine can serve
(controller_scale.py) and a cost that has nothing to do with viewers.

- **Viewer cost**: for each count in `--viewers`, that many `GET /api/v1/watch` streams are opened (asyncio
  httpx clients in this process that read and drop the bytes) and held for a warm-up and a `--window`; the
  controller's CPU (user + system, psutil) over the window, in cores. A viewer's cost is the CPU above
  the run with no viewer; the goal: the cost of 50 viewers at most 2x the cost of one (each change is
  serialised once, not once per viewer). The hub's own counters (fleet_controller_watch_*) are read too.
- **First screen**: `--first-screen` times, a child process is started (the clock starts before it is
  spawned: benchmarks/tui_first_screen.py) that imports what `fleetctl tui` does (the CLI and the TUI), runs
  it headless at 200x50 against the controller with the real stream client, and reports when the Fleet
  screen holds every engine: interpreter start, imports, connect, snapshot, parse and first render. Goal: < 2 s. The median is reported.

The TUI's own refresh time per delta and its memory over time are measured by benchmarks/tui_refresh.py.
Results: stdout and benchmarks/results/tui.json. Run it alone on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import log, print_table, write_json  # noqa: E402
from benchmarks.controller_scale import BOOTSTRAP, Controller, start_controller  # noqa: E402
from fleetctl.client import ControllerClient  # noqa: E402
from fleetctl.controller.paths import sqlite_url  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "tui.json"
CHILD = ROOT / "benchmarks" / "tui_first_screen.py"  # what `fleetctl tui` loads, and nothing of this module
GOALS = {"viewers_50_over_1": 2.0, "first_screen_s": 2.0}
MODEL, CLASS_REF = "smollm2-135m", "chat@r1"
ROLES = ("prefill", "decode", "mixed", "mixed")
NEVER_DOWN_S = 3600.0  # the heartbeat interval the controller is told: the writer, not beats, keeps nodes fresh


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/tui.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--engines-per-node", type=int, default=4)
    p.add_argument("--viewers", default="0,1,10,50", help="viewer counts, each measured in turn")
    p.add_argument("--warmup", type=float, default=8.0, help="seconds after the viewers connect, before the window")
    p.add_argument("--window", type=float, default=20.0, help="seconds of controller CPU measured per count")
    p.add_argument("--first-screen", type=int, default=3, help="times the first screen is timed")
    p.add_argument("--out", type=Path, default=OUT)
    return p.parse_args(argv)


# --- the fleet ----------------------------------------------------------------------------------------------

def populate(url: str, nodes: int, per_node: int) -> tuple[str, list[tuple[str, str]]]:
    """Nodes registered and their engines reported; a viewer token and every (node, engine)."""
    with ControllerClient(url, BOOTSTRAP, timeout=60) as admin:
        agent_token = admin.create_token("bench-agent", "agent").token
        viewer = admin.create_token("bench-viewer", "viewer").token
    keys = []
    with ControllerClient(url, agent_token, timeout=60) as agent:
        for n in range(nodes):
            node = f"node-{n:04d}"
            agent.register_agent({"node": node, "url": f"http://10.0.{n // 250}.{n % 250}:9000",
                                  "capacity": {"engines": 8, "kv_mib": 8192}, "agent_version": "bench"})
            engines = [engine_report(node, i) for i in range(per_node)]
            agent.heartbeat({"node": node, "generation": 0, "engines": engines, "cut_off_s": None})
            keys.extend((node, e["name"]) for e in engines)
            if n % 200 == 199:
                log(f"fleet: {n + 1}/{nodes} nodes")
    return viewer, keys


def engine_report(node: str, index: int) -> dict[str, Any]:
    return {"name": f"e{index}", "model": MODEL, "class_ref": CLASS_REF, "role": ROLES[index % len(ROLES)],
            "state": "ready", "url": f"http://{node}:{8100 + index}", "port": 8100 + index, "pid": 1000 + index,
            "restarts": 0, "metrics": {}}


class MetricsWriter(threading.Thread):
    """Rewrites every engine's metrics once a second, straight into the controller's database."""

    def __init__(self, db_url: str, keys: list[tuple[str, str]]):
        super().__init__(name="metrics-writer", daemon=True)
        from sqlalchemy import create_engine

        self.db = create_engine(db_url)
        self.keys, self.stop_event = keys, threading.Event()
        self.counters = {key: 0.0 for key in keys}
        self.rounds, self.seconds = 0, 0.0

    def run(self) -> None:
        while not self.stop_event.wait(max(0.0, 1.0 - (self.seconds / max(self.rounds, 1)))):
            started = time.perf_counter()
            self.write_round()
            self.rounds += 1
            self.seconds += time.perf_counter() - started

    def write_round(self) -> None:
        from sqlalchemy import bindparam, update

        from fleetctl.controller.models import Engine

        table = Engine.__table__
        statement = (update(table).where(table.c.node == bindparam("k_node"), table.c.name == bindparam("k_name"))
                     .values(metrics=bindparam("metrics"), updated_at=bindparam("at")))
        now = datetime.now(timezone.utc)
        rows = [{"k_node": node, "k_name": name, "metrics": self.metrics((node, name)), "at": now}
                for node, name in self.keys]
        with self.db.begin() as connection:
            connection.execute(statement, rows)

    def metrics(self, key: tuple[str, str]) -> dict[str, float]:
        served = self.counters[key] = self.counters[key] + random.randint(50, 400)
        return {"num_requests_running": random.randint(0, 8), "num_requests_waiting": random.randint(0, 3),
                "kv_cache_usage_perc": round(random.random(), 3), "prefix_cache_queries": served,
                "prefix_cache_hits": served * 0.6, "prompt_tokens": served * 0.8, "generation_tokens": served * 0.2,
                "ttft_seconds_sum": served / 2000, "ttft_seconds_count": served / 200,
                "itl_seconds_sum": served / 40000, "itl_seconds_count": served / 5}


# --- viewers ------------------------------------------------------------------------------------------------

class Viewers:
    """`count` change streams held open in a background event loop, each read and dropped."""

    def __init__(self, url: str, token: str, count: int):
        self.url, self.token, self.count = url, token, count
        self.bytes = [0] * count
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="viewers", daemon=True)
        self.tasks: list[Any] = []

    def __enter__(self) -> Viewers:
        self.thread.start()
        self.tasks = [asyncio.run_coroutine_threadsafe(self.read(i), self.loop) for i in range(self.count)]
        return self

    def __exit__(self, *_: Any) -> None:
        for task in self.tasks:
            task.cancel()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    async def read(self, index: int) -> None:
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "text/event-stream"}
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None)) as client:
            async with client.stream("GET", self.url + "/api/v1/watch", headers=headers) as response:
                async for chunk in response.aiter_raw():
                    self.bytes[index] += len(chunk)


def cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def hub_counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("fleet_controller_watch_") and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def measure_viewers(ctl: Controller, token: str, count: int, warmup_s: float, window_s: float) -> dict[str, Any]:
    with Viewers(ctl.url, token, count) as viewers:
        time.sleep(warmup_s)
        before_cpu, before_hub, before_bytes = cpu_s(ctl.ps), hub_counters(ctl.url), sum(viewers.bytes)
        started = time.monotonic()
        time.sleep(window_s)
        elapsed = time.monotonic() - started
        after_cpu, after_hub, after_bytes = cpu_s(ctl.ps), hub_counters(ctl.url), sum(viewers.bytes)
    growth = {name: after_hub[name] - before_hub.get(name, 0.0) for name in after_hub
              if name.endswith("_total") or name.endswith("_sum") or name.endswith("_count")}
    return {"viewers": count, "window_s": elapsed, "controller_cores": (after_cpu - before_cpu) / elapsed,
            "mib_per_s_sent": (after_bytes - before_bytes) / elapsed / 2**20, "hub": growth}


# --- first screen -------------------------------------------------------------------------------------------

def time_first_screen(url: str, token: str, engines: int) -> float:
    started = time.time()
    done = subprocess.run([sys.executable, str(CHILD), url, token, str(engines)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"first-screen child failed: {done.stderr.strip()[-800:]}")
    return float(done.stdout.strip().splitlines()[-1]) - started


# --- the run ------------------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(c) for c in args.viewers.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-tui-") as tmp:
        state_dir = Path(tmp)
        ctl = start_controller(state_dir, None, interval_s=NEVER_DOWN_S)
        try:
            setup = time.monotonic()
            token, keys = populate(ctl.url, args.nodes, args.engines_per_node)
            log(f"fleet: {args.nodes} nodes, {len(keys)} engines in {time.monotonic() - setup:.0f}s")
            writer = MetricsWriter(sqlite_url(state_dir), keys)
            writer.start()
            runs = []
            for count in counts:
                log(f"viewers: {count} for {args.warmup:g}s + {args.window:g}s")
                runs.append(measure_viewers(ctl, token, count, args.warmup, args.window))
            first = [time_first_screen(ctl.url, token, len(keys)) for _ in range(args.first_screen)]
            writer.stop_event.set()
            writer.join(timeout=10)
            return summarize(args, runs, first, writer)
        finally:
            ctl.stop()


def summarize(args: argparse.Namespace, runs: list[dict[str, Any]], first: list[float],
              writer: MetricsWriter) -> dict[str, Any]:
    idle = next((r["controller_cores"] for r in runs if r["viewers"] == 0), 0.0)
    for r in runs:
        r["viewer_cost_cores"] = r["controller_cores"] - idle
    cost = {r["viewers"]: r["viewer_cost_cores"] for r in runs}
    ratio = cost[50] / cost[1] if 50 in cost and 1 in cost and cost[1] > 0 else None
    return {"benchmark": "tui", "command": "benchmarks/tui.py " + " ".join(sys.argv[1:]),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "machine": {"cpus": psutil.cpu_count(), "loadavg_1m_end": psutil.getloadavg()[0]},
            "writer": {"rounds": writer.rounds, "mean_round_s": writer.seconds / max(writer.rounds, 1)},
            "viewers": runs, "viewers_50_over_1": ratio,
            "first_screen_s": {"runs": first, "median": statistics.median(first) if first else None},
            "goals": GOALS}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print_table(result["viewers"], [("viewers", "viewers", "d"), ("controller cores", "controller_cores", ".3f"),
                                    ("above 0 viewers", "viewer_cost_cores", ".3f"),
                                    ("MiB/s read", "mib_per_s_sent", ".2f")])
    print(f"cost of 50 viewers / cost of 1: {result['viewers_50_over_1']}")
    print(f"first full screen: {result['first_screen_s']}")
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
