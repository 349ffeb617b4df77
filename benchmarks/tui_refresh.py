"""TUI refresh benchmark: how long the TUI takes to apply one change-stream delta and redraw the Fleet screen,
on a 1,000-node, 4,000-engine fleet whose every engine's metrics change each second.

    .venv/bin/python benchmarks/tui_refresh.py [--nodes 1000] [--engines 4000] [--seconds 60] [--out FILE]

In one process, headless (Textual's run_test at 200x50): the app gets a snapshot, then one delta per
simulated second that patches `metrics` and `rates` of every engine. Each delta is timed from the inbox to
the screen's visible lines rendered: apply to the FleetState (and the engine history), the Fleet screen's
`refresh_from`, and `render_line` of every visible table line and the header: what the UI does before
the compositor paints. Parsing the delta's JSON (the stream client's work, before the inbox) is timed
apart. Three cases: sorted by node (the order stays), sorted by KV usage (it moves every second), and with
a `role:decode` filter. For comparison, Textual's DataTable with the same rows: `update_cell` of the changed
cells, and removing the rows a filter hides. The goal: p99 < 100 ms per delta, memory flat over time.
Memory: the process's RSS after each delta (growth after the first 5 s). Results: stdout and
benchmarks/results/tui_refresh.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
from textual.app import App  # noqa: E402
from textual.widgets import DataTable  # noqa: E402

from fleetctl.controller.watch_contract import WatchDelta, WatchSnapshot  # noqa: E402
from ui.app import make_app  # noqa: E402
from ui.fleet_rows import COLUMNS  # noqa: E402
from ui.messages import FleetChanged  # noqa: E402
from ui.screens.fleet import FleetScreen  # noqa: E402
from ui.widgets.header import PulseHeader  # noqa: E402
from ui.widgets.table import VirtualTable  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
AT = "2026-05-04T12:00:00+00:00"
ROLES = ("prefill", "decode", "mixed")


def node_value(name: str) -> dict[str, Any]:
    return {"name": name, "url": f"http://{name}", "state": "up", "cordoned": False, "draining": False, "labels": {},
            "capacity": {"engines": 8, "kv_mib": 1024}, "agent_version": "0.1.0", "engines": 4,
            "last_heartbeat_at": AT, "heartbeat_age_s": 1.0, "generation": 1, "applied_generation": 1,
            "cut_off_s": None, "registered_at": AT}


def engine_value(node: str, name: str, index: int) -> dict[str, Any]:
    return {"name": name, "node": node, "deployment": "d", "model": "smollm2-135m", "class_ref": f"chat@r{1 + index % 2}",
            "role": ROLES[index % 3], "state": "ready", "drain": False, "url": f"http://{node}/{name}", "port": 8100,
            "pid": 1000 + index, "kv_events_endpoint": None, "restarts": 0, "last_exit": None,
            "metrics": {}, "updated_at": AT, "drift": [], "rates": {}}


def fleet_json(nodes: int, engines: int) -> tuple[dict[str, Any], list[str]]:
    node_names = [f"node-{i:04d}" for i in range(nodes)]
    resources: dict[str, Any] = {"node": {n: node_value(n) for n in node_names}, "engine": {}}
    for index in range(engines):
        node = node_names[index % nodes]
        resources["engine"][f"{node}/e-{index}"] = engine_value(node, f"e-{index}", index)
    return {"token": "b-1", "at": AT, "ping_s": 5.0, "resources": resources, "events": []}, list(resources["engine"])


def metrics_delta_json(keys: list[str], second: int, rng: random.Random) -> dict[str, Any]:
    changes = [{"kind": "engine", "key": key, "op": "patch", "value": {
        "metrics": {"num_requests_running": rng.randrange(8), "num_requests_waiting": rng.randrange(4),
                    "kv_cache_usage_perc": rng.random()},
        "rates": {"window_s": 1.0, "tokens_s": rng.uniform(10, 90), "prefix_hit_rate": rng.random(),
                  "ttft_s": rng.uniform(0.05, 0.6), "itl_s": rng.uniform(0.01, 0.05)},
        "updated_at": AT}} for key in keys]
    return {"token": f"b-{second + 2}", "at": AT, "changes": changes, "events": []}


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50_ms": 1000 * statistics.median(ordered), "p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))],
            "max_ms": 1000 * ordered[-1]}


async def measure_case(snapshot: dict[str, Any], keys: list[str], seconds: int, setup: str) -> dict[str, Any]:
    app = make_app(source=_Silent(), clock=lambda: datetime.now(timezone.utc))
    rng = random.Random(7)
    timings, parse_s = [], []
    case_started = time.perf_counter()
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        app.inbox.put(WatchSnapshot.model_validate(snapshot))
        _deliver(app)
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        if setup == "sort kv":
            screen.action_sort_by("kv")
        elif setup == "filter":
            screen.set_filter("role:decode")
        process, memory = psutil.Process(), []
        for second in range(seconds):
            raw = metrics_delta_json(keys, second, rng)
            started = time.perf_counter()
            app.inbox.put(WatchDelta.model_validate(raw))  # as the stream's worker does
            parse_s.append(time.perf_counter() - started)
            del raw
            started = time.perf_counter()
            _deliver(app)
            _render_visible(screen)
            timings.append(time.perf_counter() - started)
            memory.append(process.memory_info().rss)
            await pilot.pause()
    return {"case": setup, "apply_refresh": summary(timings), "parse": summary(parse_s),
            "rss_growth_kib": (memory[-1] - memory[min(5, len(memory) - 1)]) / 1024,
            "rss_mib": memory[-1] / 2**20,
            "wall_s": time.perf_counter() - case_started}


class _Silent:
    """A source that sends nothing: the benchmark delivers messages itself, timed."""

    def __aiter__(self) -> "_Silent":
        return self

    async def __anext__(self) -> Any:
        await asyncio.Event().wait()


def _deliver(app: Any) -> None:
    """What the app does when woken with a message in its inbox: apply it, then hand the change to the
    screen (synchronously here, to time it; the app posts it as a message)."""
    batch = app.take_inbox()
    if batch.applied is not None:
        app.on_fleet_changed(FleetChanged(batch.applied))


def _render_visible(screen: FleetScreen) -> None:
    table = screen.query_one(VirtualTable)
    for y in range(table.size.height):
        table.render_line(y)
    screen.query_one(PulseHeader).render()


class _TableApp(App[None]):
    def compose(self) -> Any:
        yield DataTable()


async def measure_datatable(snapshot: dict[str, Any], keys: list[str], seconds: int) -> dict[str, Any]:
    """The same rows in Textual's DataTable: per-second update_cell of the six changing cells of every engine,
    and a filter that removes the rows it hides."""
    rng = random.Random(7)
    app = _TableApp()
    async with app.run_test(size=(200, 50)) as pilot:
        table = app.query_one(DataTable)
        for column in COLUMNS:
            table.add_column(column.label, key=column.key, width=column.min)
        for key in keys:
            table.add_row(*(["x"] * len(COLUMNS)), key=key)
        await pilot.pause()
        timings = []
        for _ in range(min(seconds, 10)):
            started = time.perf_counter()
            for key in keys:
                for column in ("queue", "kv", "hit", "ttft", "itl", "restarts"):
                    table.update_cell(key, column, f"{rng.random():.2f}")
            for y in range(table.size.height):
                table.render_line(y)
            timings.append(time.perf_counter() - started)
            await pilot.pause()
        hidden = [key for index, key in enumerate(keys) if index % 3 != 1][:1000]
        started = time.perf_counter()
        for key in hidden:
            table.remove_row(key)
        remove_s = time.perf_counter() - started
    return {"update_cells": summary(timings), "filter_remove_1000_rows_ms": 1000 * remove_s}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    snapshot, keys = fleet_json(args.nodes, args.engines)
    cases = [await measure_case(snapshot, keys, args.seconds, setup) for setup in ("sort node", "sort kv", "filter")]
    return {"nodes": args.nodes, "engines": args.engines, "seconds": args.seconds, "cases": cases,
            "datatable": await measure_datatable(snapshot, keys, args.seconds)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--engines", type=int, default=4000)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--out", type=Path, default=RESULTS / "tui_refresh.json")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    for case in results["cases"]:
        a, p = case["apply_refresh"], case["parse"]
        print(f"{case['case']:<10} apply+refresh p50 {a['p50_ms']:.1f} ms p99 {a['p99_ms']:.1f} ms max {a['max_ms']:.1f} ms"
              f" | parse p50 {p['p50_ms']:.1f} ms p99 {p['p99_ms']:.1f} ms | RSS {case['rss_mib']:.0f} MiB,"
              f" +{case['rss_growth_kib']:.0f} KiB after the first 5 s"
              f" | {case['wall_s']:.0f} s")
    table = results["datatable"]
    print(f"DataTable  update_cell p50 {table['update_cells']['p50_ms']:.1f} ms p99 {table['update_cells']['p99_ms']:.1f} ms"
          f" | remove 1000 rows {table['filter_remove_1000_rows_ms']:.0f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
