"""Controller scale benchmark: N simulated agents heartbeating against a real controller process.

    .venv/bin/python benchmarks/controller_scale.py [--db sqlite,postgres] [--nodes 100,1000] [--window 20]
        [--warmup 10] [--repeat 1] [--quick] [--paced-rate R] [--compare-tree DIR] [--in-process] [--out FILE]

For each database and fleet size N, a fresh controller (`python -m fleetctl.cli.main controller serve`, its own
state dir; on PostgreSQL its own schema, dropped afterwards) is started as a separate process, told the agents'
heartbeat interval (1 s; down after 3 missed). One class and one deployment with N replicas give every node
one assigned engine, so each reply carries an assignment with its class spec. N agents (asyncio tasks in this
one process on uvloop, beating through the lean keep-alive HTTP/1.1 client the gateway also uses (fleetctl/httpwire.py:
httpx cost the generator more CPU per beat than the controller spent; they register with
`AsyncControllerClient`); at most IN_FLIGHT beats on the wire, on as many
keep-alive connections) register, then heartbeat once a second on phases spread uniformly over the second,
each reporting 2 engines with metrics (docs/contracts.md): the assigned one and one more. A missed slot is
skipped, never sent late in a burst. After a warm-up, a window is measured:
- heartbeat latency (client side, request sent to reply parsed) p50 / p99 / max, and the achieved rate (beats
  completed in the window / s) against the target N/s; `send_lag_ms`: how late beats left against their slot
  (waiting for the generator's loop or for a free connection: the generator's or the controller's backlog);
- controller CPU (psutil user+system of the controller process over the window) per beat completed in the
  window; the generator's own CPU; on PostgreSQL the CPU of the controller's PostgreSQL backends
  (approximate: found by the controller's client ports at window start and end);
- noise: the controller's and generator's run-queue wait (runnable, waiting for a CPU, from schedstat) and
  how many cores the whole machine was busy (/proc/stat, every process included).
Then `fleetctl status -o json` is timed end to end as a subprocess (median of 5; 3 with --quick), and the
API call alone, first while the agents keep heartbeating, then with the fleet idle.

--paced-rate R: also run every fleet larger than R at R beats/s in total (each node every N/R s, the controller
told that interval), so the CPU of a beat is compared across fleet sizes at one load; on a machine that cannot
serve 1,000 beats/s this separates "a beat costs more in a bigger fleet" from "an overloaded controller wastes
work". --compare-tree DIR: also run each configuration with the controller imported from DIR (an older
commit: `git archive <commit> fleetctl migrations | tar -x -C DIR`), interleaved; those runs are labelled
with DIR and marked `*` in the table. --in-process: instead, the CPU of the heartbeat's store work
(`nodes.heartbeat` in its transaction) and of one reconcile pass at each fleet size, in this process (no
HTTP), to benchmarks/results/controller_scale_inprocess.json.

The controller's CPU includes its reconcile loop (every 2 s, leader only), which reads the whole fleet: it
is part of what the controller spends per heartbeat. Results go to stdout and
benchmarks/results/controller_scale.json. --quick: 5 s warm-up, 10 s window unless --window is given,
status timed 3 times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleetctl.client import AsyncControllerClient, ControllerClient  # noqa: E402
from fleetctl.controller.server import free_port  # noqa: E402
from fleetctl.controller.testing import pg_test_schema  # noqa: E402
from fleetctl.httpwire import EngineClient, EngineHTTPError  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "controller_scale.json"
PG_URL = os.environ.get("FLEET_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BOOTSTRAP = "bench-bootstrap-token-0123456789"
CONTROLLER_CWD = ROOT  # where the controller process runs (its code is imported from there)
# Heartbeats in flight at once, on as many keep-alive connections. httpcore's pool does O(connections^2 +
# queued x connections) work on every request, so a pool (or a queue in it) the size of the fleet makes the
# generator, not the controller, the bottleneck (measured: ~1.5 ms client CPU a beat at 100 connections, ~8 ms
# at 256 with a queue). 32 is ~30x what 1,000 beats/s at 10 ms need; a beat waiting for a free connection
# counts in `send_lag_ms`, not in the latency.
IN_FLIGHT = 32
HEARTBEAT_PATH = "/api/v1/agents/heartbeat"
BEAT_HEADERS = {"content-type": "application/json", "accept": "*/*"}
BEAT_CONNECT_S, BEAT_TIMEOUT_S = 10.0, 30.0
INTERVAL_S = 1.0
SPEC = {"model": "smollm2-135m", "weights": "smollm2", "max_model_len": 4096, "kv_cache_mib": 512,
        "max_num_seqs": 64, "engine_args": {"enforce-eager": True}}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def runqueue_wait(pid: int) -> dict[str, int]:
    """Per thread: nanoseconds spent runnable but waiting for a CPU (/proc/PID/task/TID/schedstat)."""
    waits = {}
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            waits[stat.parent.name] = int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return waits


def runqueue_wait_delta_s(start: dict[str, int], end: dict[str, int]) -> float:
    """Run-queue wait between two samples, summed over threads alive at the end (threads that exited in
    between are not counted)."""
    return sum(v - start.get(tid, 0) for tid, v in end.items()) / 1e9


def machine_busy_cores() -> tuple[float, float]:
    """(busy jiffies, all jiffies) over all CPUs since boot, from /proc/stat."""
    fields = [float(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


# --- the controller process --------------------------------------------------------------------------


@dataclass
class Controller:
    proc: subprocess.Popen[bytes]
    url: str
    db_url: str | None
    state_dir: Path

    @property
    def ps(self) -> psutil.Process:
        return psutil.Process(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_controller(state_dir: Path, db_url: str | None, interval_s: float = INTERVAL_S) -> Controller:
    port = free_port()
    env = {**os.environ, "FLEET_STATE_DIR": str(state_dir), "FLEET_BOOTSTRAP_TOKEN": BOOTSTRAP,
           "FLEET_HEARTBEAT_INTERVAL_S": str(interval_s)}
    env.pop("FLEET_DB_URL", None)
    if db_url:
        env["FLEET_DB_URL"] = db_url
    logfile = open(state_dir / "controller.log", "wb")  # noqa: SIM115 - kept open for the process's life
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetctl.cli.main", "controller", "serve", "--port", str(port), "--log-level", "warning"],
        cwd=CONTROLLER_CWD, env=env, stdout=logfile, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"controller exited ({proc.returncode}); see {state_dir / 'controller.log'}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return Controller(proc, url, db_url, state_dir)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("controller did not become healthy in 60 s")


def prepare_fleet(ctl: Controller, nodes: int) -> tuple[str, str]:
    """Tokens for the agents and for `status`; one class and a deployment with one engine per node."""
    with ControllerClient(ctl.url, BOOTSTRAP, timeout=30) as admin:
        agent = admin.create_token("bench-agent", "agent").token
        viewer = admin.create_token("bench-viewer", "viewer").token
        ref = admin.apply_class("chat", SPEC).ref
        admin.set_deployment("chat", ref, replicas=nodes)
    return agent, viewer


# --- PostgreSQL backends of the controller -----------------------------------------------------------


class PgBackends:
    """CPU of the PostgreSQL server processes serving the controller's connections (approximate: backends
    are found by the controller's client ports when sampled; ones that come and go in between are missed)."""

    def __init__(self, ctl: Controller):
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        self.ctl = ctl
        self.engine = create_engine(PG_URL, poolclass=NullPool)

    def sample(self) -> dict[int, float]:
        from sqlalchemy import text

        ports = {c.laddr.port for c in self.ctl.ps.net_connections(kind="tcp") if c.raddr and c.raddr.port == 5432}
        if not ports:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(text("SELECT pid, client_port FROM pg_stat_activity WHERE client_port IS NOT NULL")).all()
        cpu = {}
        for pid, port in rows:
            if port in ports:
                try:
                    cpu[pid] = cpu_s(psutil.Process(pid))
                except psutil.Error:
                    pass
        return cpu

    def close(self) -> None:
        self.engine.dispose()

    @staticmethod
    def delta(start: dict[int, float], end: dict[int, float]) -> float:
        return sum(v - start.get(pid, 0.0) for pid, v in end.items())


# --- the simulated agents ----------------------------------------------------------------------------


@dataclass
class Beat:
    slot: float  # when it was due (perf_counter)
    sent: float
    done: float
    ok: bool


@dataclass
class SimAgent:
    index: int
    nodes: int
    interval_s: float = INTERVAL_S
    generation: int = 0
    assignment: list[dict[str, Any]] = field(default_factory=list)
    beats: list[Beat] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"node-{self.index:05d}"

    def registration(self) -> dict[str, Any]:
        zone = "abc"[self.index % 3]
        return {"node": self.name, "url": f"http://10.0.{self.index // 250}.{self.index % 250}:9000",
                "labels": {"zone": zone, "gpu": "h100", "pool": "chat"},
                "capacity": {"engines": 2, "kv_mib": 65536}, "agent_version": "0.1.0"}

    def engine(self, i: int, name: str, model: str, class_ref: str, role: str) -> dict[str, Any]:
        port = 8100 + i
        host = f"10.0.{self.index // 250}.{self.index % 250}"
        beat = len(self.beats)
        return {
            "name": name, "model": model, "class_ref": class_ref, "role": role, "state": "ready",
            "pid": 40000 + 2 * self.index + i, "port": port, "url": f"http://{host}:{port}",
            "kv_events_endpoint": f"tcp://{host}:{port + 1000}", "restarts": 0, "last_exit": None,
            "metrics": {"num_requests_running": (self.index + beat) % 17, "num_requests_waiting": (self.index + beat) % 3,
                        "kv_cache_usage_perc": ((self.index * 7 + beat) % 100) / 100,
                        "prefix_cache_queries": 1000 + 37 * beat, "prefix_cache_hits": 400 + 21 * beat},
        }

    def payload(self) -> dict[str, Any]:
        engines = [self.engine(i, a["name"], a["model"], a["class_ref"], a["role"]) for i, a in enumerate(self.assignment[:2])]
        while len(engines) < 2:  # the agent's other engine (not assigned by a deployment, still reported)
            engines.append(self.engine(len(engines), f"{self.name}-aux{len(engines)}", "smollm2-135m-aux", "aux@r1", "mixed"))
        return {"node": self.name, "generation": self.generation, "engines": engines, "cut_off_s": None}

    async def run(self, client: EngineClient, ctl_url: str, headers: dict[str, str], in_flight: asyncio.Semaphore,
                  start: float, stop: float, finished: asyncio.Event) -> None:
        slot = start + self.index / self.nodes * self.interval_s  # phases spread uniformly over the interval
        # `finished` as well as cancellation: Python 3.11's asyncio.wait_for can swallow a cancellation that
        # races with its inner call completing, and the agent would then beat on until `stop`
        while slot < stop and not finished.is_set():
            delay = slot - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            ok = True
            async with in_flight:  # a free connection (see IN_FLIGHT)
                sent = time.perf_counter()
                try:
                    reply = await post_beat(client, ctl_url, self.payload(), headers)
                    self.generation, self.assignment = reply["generation"], reply["assignment"]
                except (BeatFailed, EngineHTTPError, OSError, asyncio.TimeoutError) as exc:
                    ok = False
                    if len(self.errors) < 5:
                        self.errors.append(f"{type(exc).__name__}: {exc}")
                done = time.perf_counter()
            self.beats.append(Beat(slot, sent, done, ok))
            slot += self.interval_s
            now = time.perf_counter()
            while slot < now:  # a missed slot is skipped, not sent late in a burst
                slot += self.interval_s


class BeatFailed(Exception):
    """The controller answered a heartbeat with something other than a 200 and a JSON object."""


async def post_beat(client: EngineClient, ctl_url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """One heartbeat: the reply, or BeatFailed / the client's transport errors / a timeout."""

    async def call() -> tuple[int, bytes]:
        payload = json.dumps(body, separators=(",", ":")).encode()
        response = await client.request("POST", ctl_url + HEARTBEAT_PATH, payload, {**BEAT_HEADERS, **headers},
                                        BEAT_CONNECT_S)
        try:
            return response.status, await response.read()
        finally:
            await response.aclose()

    status, content = await asyncio.wait_for(call(), BEAT_TIMEOUT_S)
    if status != 200:
        raise BeatFailed(f"{ctl_url}: HTTP {status} {content[:200]!r}")
    try:
        reply = json.loads(content)
    except ValueError:
        raise BeatFailed(f"{ctl_url}: the answer is not JSON") from None
    if not isinstance(reply, dict):
        raise BeatFailed(f"{ctl_url}: the answer is not a JSON object")
    return reply


async def register_all(client: AsyncControllerClient, agents: list[SimAgent]) -> None:
    gate = asyncio.Semaphore(32)

    async def one(agent: SimAgent) -> None:
        async with gate:
            await client.register_agent(agent.registration())

    await asyncio.gather(*(one(a) for a in agents))


async def wait_placed(url: str, viewer: str, nodes: int, timeout_s: float = 120) -> None:
    async with AsyncControllerClient(url, viewer, timeout=30) as client:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = await client.status()
            placed = sum(1 for e in status.engines if e.deployment == "chat" and not e.drain)
            if placed >= nodes:
                return
            await asyncio.sleep(0.5)
    raise RuntimeError(f"the reconciler did not place {nodes} engines in {timeout_s} s")


# --- `fleetctl status -o json` -----------------------------------------------------------------------


def status_cli_cmd(url: str, token: str) -> list[str]:
    return [sys.executable, "-m", "fleetctl.cli.main", "--controller", url, "--token", token, "status", "-o", "json"]


def time_status_cli(url: str, token: str, nodes: int) -> float:
    start = time.perf_counter()
    done = subprocess.run(status_cli_cmd(url, token), cwd=ROOT, capture_output=True, check=True)
    elapsed = time.perf_counter() - start
    data = json.loads(done.stdout)
    if len(data["nodes"]) != nodes:
        raise RuntimeError(f"status showed {len(data['nodes'])} nodes, expected {nodes}")
    return elapsed


def time_status_api(client: ControllerClient) -> tuple[float, int]:
    start = time.perf_counter()
    response = client._http.get("/api/v1/status")  # the raw call: time to the full body, then parse
    response.raise_for_status()
    response.json()
    return time.perf_counter() - start, len(response.content)


def status_timings(url: str, token: str, nodes: int, times: int) -> dict[str, Any]:
    with ControllerClient(url, token, timeout=60) as client:
        time_status_api(client)  # connect and warm up
        api = [time_status_api(client) for _ in range(times)]
    cli = [time_status_cli(url, token, nodes) for _ in range(times)]
    return {"cli_s": [round(t, 4) for t in cli], "cli_median_s": round(statistics.median(cli), 4),
            "api_s": [round(t, 4) for t, _ in api], "api_median_s": round(statistics.median(t for t, _ in api), 4),
            "body_bytes": api[0][1]}


def python_startup_s(times: int) -> float:
    """`python -c 'import fleetctl.cli.main'`: the CLI's import cost, for reading the CLI figure."""
    runs = []
    for _ in range(times):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import fleetctl.cli.main"], cwd=ROOT, check=True)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


# --- one configuration -------------------------------------------------------------------------------


async def load_and_measure(ctl: Controller, agent_token: str, viewer: str, nodes: int, interval_s: float, warmup: float,
                           window: float, status_times: int) -> dict[str, Any]:
    pool = min(nodes, IN_FLIGHT)
    in_flight = asyncio.Semaphore(pool)
    # keep-alive expiry below uvicorn's 5 s idle timeout: with both at 5 s, a request sent on a connection the
    # server is closing at that moment fails with ReadError (a race of the two clocks, not controller load)
    limits = httpx.Limits(max_connections=pool, max_keepalive_connections=pool, keepalive_expiry=4.0)
    transport = httpx.AsyncHTTPTransport(limits=limits)
    agents = [SimAgent(i, nodes, interval_s) for i in range(nodes)]
    me, controller = psutil.Process(), ctl.ps
    pg = PgBackends(ctl) if ctl.db_url else None
    beats, beat_headers = EngineClient(max_idle_per_engine=pool), {"authorization": f"Bearer {agent_token}"}
    async with AsyncControllerClient(ctl.url, agent_token, timeout=30, transport=transport) as client:
        t = time.perf_counter()
        await register_all(client, agents)
        await wait_placed(ctl.url, viewer, nodes)
        log(f"  {nodes} nodes registered and placed in {time.perf_counter() - t:.1f} s")
        start = time.perf_counter() + 0.5
        w0, w1 = start + warmup, start + warmup + window
        stop = w1 + 300.0  # agents keep beating through the under-load status timing; cancelled after it
        finished = asyncio.Event()
        tasks = [asyncio.create_task(a.run(beats, ctl.url, beat_headers, in_flight, start, stop, finished)) for a in agents]
        await asyncio.sleep(w0 - time.perf_counter())
        c0, m0, wall0 = cpu_s(controller), cpu_s(me), time.perf_counter()
        q0, g0, busy0 = runqueue_wait(controller.pid), runqueue_wait(me.pid), machine_busy_cores()
        pg0 = await asyncio.to_thread(pg.sample) if pg else {}
        await asyncio.sleep(w1 - time.perf_counter())
        c1, m1, wall1 = cpu_s(controller), cpu_s(me), time.perf_counter()
        q1, g1, busy1 = runqueue_wait(controller.pid), runqueue_wait(me.pid), machine_busy_cores()
        pg1 = await asyncio.to_thread(pg.sample) if pg else {}
        log("  window done; timing status while the agents keep beating")
        loaded = await asyncio.to_thread(status_timings, ctl.url, viewer, nodes, status_times)
        finished.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await beats.aclose()
    if pg:
        pg.close()
    idle = status_timings(ctl.url, viewer, nodes, status_times)

    span = wall1 - wall0
    in_window = [b for a in agents for b in a.beats if w0 <= b.slot < w1]  # due in the window
    done_ok = [b for a in agents for b in a.beats if b.ok and wall0 <= b.done < wall1]  # served in the window
    latencies = [(b.done - b.sent) * 1000 for b in in_window if b.ok]
    lags = [(b.sent - b.slot) * 1000 for b in in_window]
    due = nodes * window / interval_s
    errors = sorted({e for a in agents for e in a.errors})
    served = len(done_ok)
    result = {
        "nodes": nodes, "interval_s": interval_s, "window_s": round(span, 2), "target_rate_per_s": nodes / interval_s,
        "achieved_rate_per_s": round(served / span, 1), "heartbeats_due": int(due), "heartbeats_sent": len(in_window),
        "heartbeats_ok": sum(b.ok for b in in_window), "heartbeats_failed": sum(not b.ok for b in in_window),
        "errors": errors[:5],
        "latency_ms": {"p50": round(percentile(latencies, 50), 2), "p90": round(percentile(latencies, 90), 2),
                       "p99": round(percentile(latencies, 99), 2), "max": round(max(latencies, default=float("nan")), 2)},
        "send_lag_ms": {"p50": round(percentile(lags, 50), 2), "p99": round(percentile(lags, 99), 2)},
        "controller_cpu_s": round(c1 - c0, 3), "controller_cpu_util": round((c1 - c0) / span, 3),
        "controller_cpu_ms_per_heartbeat": round((c1 - c0) / max(served, 1) * 1000, 4),
        "generator_cpu_s": round(m1 - m0, 3), "generator_cpu_util": round((m1 - m0) / span, 3),
        "generator_cpu_ms_per_heartbeat": round((m1 - m0) / max(served, 1) * 1000, 4),
        "client_pool_connections": pool,
        # noise: how long our processes waited for a CPU, and how busy the whole machine was (all processes)
        "controller_runqueue_wait_s": round(runqueue_wait_delta_s(q0, q1), 3),
        "generator_runqueue_wait_s": round(runqueue_wait_delta_s(g0, g1), 3),
        "machine_busy_cores": round((busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1) * (os.cpu_count() or 1), 2),
        "status_under_load": loaded, "status_idle": idle,
    }
    if pg:
        pg_cpu = PgBackends.delta(pg0, pg1)
        result.update(pg_backend_cpu_s=round(pg_cpu, 3),
                      pg_backend_cpu_ms_per_heartbeat=round(pg_cpu / max(served, 1) * 1000, 4),
                      pg_backends_sampled=[len(pg0), len(pg1)])
    return result


def loop_factory() -> Any:
    """uvloop for the generator when installed (about 10% less client CPU per beat than asyncio's loop)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_config(db: str, nodes: int, interval_s: float, warmup: float, window: float, status_times: int) -> dict[str, Any]:
    with ExitStack() as stack:
        state_dir = Path(tempfile.mkdtemp(prefix=f"fleet-bench-{db}-{nodes}-"))
        stack.callback(shutil.rmtree, state_dir, ignore_errors=True)
        db_url = stack.enter_context(pg_test_schema(PG_URL, durable=True)) if db == "postgres" else None
        ctl = start_controller(state_dir, db_url, interval_s)
        stack.callback(ctl.stop)
        agent_token, viewer = prepare_fleet(ctl, nodes)
        load_avg_before = os.getloadavg()[0]
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            result = runner.run(load_and_measure(ctl, agent_token, viewer, nodes, interval_s, warmup, window, status_times))
        result.update(db=db, load_avg_1m_before=round(load_avg_before, 2), load_avg_1m_after=round(os.getloadavg()[0], 2))
        problems = [line for line in (state_dir / "controller.log").read_text(errors="replace").splitlines()
                    if "ERROR" in line or "Error" in line or "WARNING" in line]
        result["controller_log_problems"] = problems[:20]
        for line in problems[:20]:
            log(f"  controller log: {line[:300]}")
        if ctl.proc.poll() is not None:
            raise RuntimeError(f"controller died during the run; see {state_dir / 'controller.log'}")
        return result


# --- in process: the heartbeat's store work and a reconcile pass, by fleet size --------------------------


def in_process(dbs: list[str], sizes: list[int], calls: int, rounds: int) -> dict[str, Any]:
    """CPU (this thread) of `nodes.heartbeat` in its own transaction, and of one `reconcile_once` pass, on a
    store holding `nodes` registered nodes with one assigned and two reported engines each. No HTTP, no
    threads: the part of a beat that could grow with the fleet, measured on its own."""
    from datetime import datetime, timezone

    from fleetctl.controller import classes, deployments, nodes as node_store
    from fleetctl.controller.contract import HeartbeatRequest, RegisterRequest
    from fleetctl.controller.db import Store, migrate
    from fleetctl.controller.reconciler import reconcile_once
    from fleetctl.controller.schemas import DeploymentSet
    from fleetctl.replica_class import ReplicaClassSpec

    def now() -> datetime:
        return datetime.now(timezone.utc)

    def one(url: str, size: int) -> tuple[float, float]:
        store = Store.from_url(url)
        try:
            migrate(store.engine)
            agents = [SimAgent(i, size) for i in range(size)]
            with store.session() as session:
                for agent in agents:
                    node_store.register(session, RegisterRequest.model_validate(agent.registration()), now())
                revision, _ = classes.apply_class(session, "chat", ReplicaClassSpec(**SPEC), "bench", now())
                deployments.set_deployment(session, "chat", DeploymentSet(class_ref=revision.ref, replicas=size), "bench", now())
            with store.session() as session:
                reconcile_once(session, now(), 3600)

            def beat(agent: SimAgent) -> float:
                request = HeartbeatRequest.model_validate(agent.payload())
                start = time.thread_time()
                with store.session() as session:
                    result = node_store.heartbeat(session, request, now())
                spent = time.thread_time() - start
                agent.generation, agent.assignment = result.generation, result.assignment
                agent.beats.append(Beat(0, 0, 0, True))
                return spent

            for agent in agents:  # every node reports its engines once (and learns its assignment)
                beat(agent)
            beat_cpu = statistics.mean(beat(agents[k % size]) for k in range(calls))
            passes = []
            for _ in range(5):
                start = time.thread_time()
                with store.session() as session:
                    reconcile_once(session, now(), 3600)
                passes.append(time.thread_time() - start)
            return beat_cpu * 1000, statistics.median(passes) * 1000
        finally:
            store.close()

    out: dict[str, Any] = {}
    for rnd in range(1, rounds + 1):
        for db in dbs:
            for size in sizes:
                with ExitStack() as stack:
                    if db == "postgres":
                        url = stack.enter_context(pg_test_schema(PG_URL, durable=True))
                    else:
                        folder = tempfile.mkdtemp(prefix="fleet-bench-inproc-")
                        stack.callback(shutil.rmtree, folder, ignore_errors=True)
                        url = f"sqlite:///{folder}/fleet.db"
                    beat_ms, pass_ms = one(url, size)
                key = f"{db} N={size}"
                out.setdefault(key, {"heartbeat_cpu_ms": [], "reconcile_pass_cpu_ms": []})
                out[key]["heartbeat_cpu_ms"].append(round(beat_ms, 3))
                out[key]["reconcile_pass_cpu_ms"].append(round(pass_ms, 2))
                log(f"  in process, round {rnd}: {key}: heartbeat {beat_ms:.3f} ms CPU, reconcile pass {pass_ms:.1f} ms CPU")
    return out


# --- report ------------------------------------------------------------------------------------------


def print_table(runs: list[dict[str, Any]]) -> None:
    """rate/s: achieved/target; lag99: p99 of how late beats left against their slot (generator overload);
    util: CPU cores used; ctl wait: controller threads' run-queue wait per second (CPU starvation);
    busy: cores busy on the whole machine (every process, other engineers' included); status: idle fleet;
    db*: controller from --compare-tree."""
    header = (f"{'db':9} {'N':>5} {'every':>5} {'rate/s':>13} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'lag99':>7} "
              f"{'ctl ms/hb':>9} {'ctl util':>8} {'gen util':>8} {'pg ms/hb':>8} {'ctl wait':>8} {'busy':>5} "
              f"{'status CLI s':>13} {'API s':>7}")
    print(header)
    print("-" * len(header))
    for r in runs:
        rate = f"{r['achieved_rate_per_s']:.0f}/{r['target_rate_per_s']:.0f}"
        pg = f"{r['pg_backend_cpu_ms_per_heartbeat']:.3f}" if "pg_backend_cpu_ms_per_heartbeat" in r else "-"
        print(f"{r['db'] + ('' if r['controller_tree'] == 'working tree' else '*'):9} {r['nodes']:>5} {r['interval_s']:>4g}s {rate:>13} {r['latency_ms']['p50']:>8.2f} {r['latency_ms']['p99']:>8.2f} "
              f"{r['latency_ms']['max']:>8.1f} {r['send_lag_ms']['p99']:>7.1f} {r['controller_cpu_ms_per_heartbeat']:>9.3f} "
              f"{r['controller_cpu_util']:>8.2f} {r['generator_cpu_util']:>8.2f} {pg:>8} "
              f"{r['controller_runqueue_wait_s'] / r['window_s']:>8.2f} {r['machine_busy_cores']:>5.2f} "
              f"{r['status_idle']['cli_median_s']:>13.3f} {r['status_idle']['api_median_s']:>7.3f}")


def summarize(all_runs: list[dict[str, Any]], small: int, large: int) -> dict[str, Any]:
    """Ratios within each round (same run), and the goals (on the working tree's controller). With
    --compare-tree, also this tree's controller CPU per beat over the other tree's, per round."""
    summary: dict[str, Any] = {"cpu_ratio_large_vs_small": {}, "goals": {}}
    before = [r for r in all_runs if r["controller_tree"] != "working tree"]
    paced = [r for r in all_runs if r["controller_tree"] == "working tree" and r["interval_s"] != INTERVAL_S]
    runs = [r for r in all_runs if r["controller_tree"] == "working tree" and r["interval_s"] == INTERVAL_S]
    if before:
        summary["cpu_ratio_working_tree_vs_compare_tree"] = {
            f"{r['db']} N={r['nodes']} every {r['interval_s']:g}s #{r['round']}":
                round(r["controller_cpu_ms_per_heartbeat"] / b["controller_cpu_ms_per_heartbeat"], 3)
            for r in runs + paced for b in before
            if (b["db"], b["nodes"], b["interval_s"], b["round"]) == (r["db"], r["nodes"], r["interval_s"], r["round"])
        }
    for db in sorted({r["db"] for r in runs}):
        ratios, at_one_rate = [], []
        for rnd in sorted({r["round"] for r in runs}):
            pick = {r["nodes"]: r for r in runs if r["db"] == db and r["round"] == rnd}
            if small in pick and large in pick:
                ratios.append(round(pick[large]["controller_cpu_ms_per_heartbeat"] / pick[small]["controller_cpu_ms_per_heartbeat"], 3))
            slow = [r for r in paced if r["db"] == db and r["round"] == rnd and r["nodes"] == large]
            if slow and small in pick:
                at_one_rate.append(round(slow[0]["controller_cpu_ms_per_heartbeat"] / pick[small]["controller_cpu_ms_per_heartbeat"], 3))
        if ratios:
            summary["cpu_ratio_large_vs_small"][db] = ratios
            summary["goals"][f"cpu_per_heartbeat_{large}_within_1.3x_of_{small}_{db}"] = {
                "ratios": ratios, "met": all(x <= 1.3 for x in ratios)}
        if at_one_rate:
            summary.setdefault("cpu_ratio_large_vs_small_at_one_rate", {})[db] = at_one_rate
    pg_large = [r for r in runs if r["db"] == "postgres" and r["nodes"] == large]
    if pg_large:
        summary["goals"][f"p99_under_50ms_at_{large}_postgres"] = {
            "p99_ms": [r["latency_ms"]["p99"] for r in pg_large],
            "achieved_vs_target_rate": [[r["achieved_rate_per_s"], r["target_rate_per_s"]] for r in pg_large],
            "met": all(r["latency_ms"]["p99"] < 50 and r["achieved_rate_per_s"] >= 0.98 * r["target_rate_per_s"] for r in pg_large),
        }
    at_large = [r for r in runs if r["nodes"] == large]  # status: the 1 s runs (the paced ones have it too)
    if at_large:
        summary["goals"][f"status_cli_under_0.5s_at_{large}"] = {
            "cli_median_s_idle": {f"{r['db']}#{r['round']}": r["status_idle"]["cli_median_s"] for r in at_large},
            "cli_median_s_under_load": {f"{r['db']}#{r['round']}": r["status_under_load"]["cli_median_s"] for r in at_large},
            "met_idle": all(r["status_idle"]["cli_median_s"] < 0.5 for r in at_large),
            "met_under_load": all(r["status_under_load"]["cli_median_s"] < 0.5 for r in at_large),
        }
    return summary


def machine() -> dict[str, Any]:
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    return {"cpus": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
            "generator_loop": "uvloop" if loop_factory() else "asyncio",
            "platform": platform.platform(), "commit": commit, "load_avg_at_start": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    parser.add_argument("--nodes", default="100,1000", help="comma-separated fleet sizes")
    parser.add_argument("--window", type=float, default=None, help="measured seconds (default 20; 10 with --quick)")
    parser.add_argument("--warmup", type=float, default=None, help="seconds of heartbeats before the window (default 10; 5 with --quick)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; each runs every configuration once")
    parser.add_argument("--quick", action="store_true", help="shorter warm-up and window, status timed 3 times")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--paced-rate", type=float, default=None,
                        help="also run every fleet larger than this at this many beats/s in total (interval N/rate s), "
                             "so the cost of a beat is compared across fleet sizes at one load")
    parser.add_argument("--in-process", action="store_true",
                        help="instead: CPU of the heartbeat's store work and of a reconcile pass by fleet size, in this "
                             "process (no HTTP); written to benchmarks/results/controller_scale_inprocess.json")
    parser.add_argument("--compare-tree", type=Path, default=None,
                        help="also run each configuration with the controller imported from this tree (e.g. an older "
                             "commit exported with `git archive`), interleaved; runs are labelled by tree")
    args = parser.parse_args()
    dbs = [d.strip() for d in args.db.split(",") if d.strip()]
    sizes = [int(n) for n in args.nodes.split(",") if n.strip()]
    window = args.window or (10.0 if args.quick else 20.0)
    warmup = args.warmup if args.warmup is not None else (5.0 if args.quick else 10.0)
    status_times = 3 if args.quick else 5
    meta = machine()
    if args.in_process:
        rounds = max(args.repeat, 1)
        result = in_process(dbs, sizes, calls=1000 if args.quick else 3000, rounds=rounds)
        print(json.dumps(result, indent=2))
        out_path = args.out if args.out != RESULTS else RESULTS.with_name("controller_scale_inprocess.json")
        out_path.write_text(json.dumps({"command": "python benchmarks/controller_scale.py " + " ".join(sys.argv[1:]),
                                        "machine": meta, "results": result}, indent=2) + "\n")
        log(f"wrote {out_path}")
        return
    runs: list[dict[str, Any]] = []
    trees = [("working tree", ROOT)] + ([(str(args.compare_tree), args.compare_tree.resolve())] if args.compare_tree else [])
    global CONTROLLER_CWD
    configs = [(nodes, INTERVAL_S) for nodes in sizes]
    if args.paced_rate:
        configs += [(nodes, nodes / args.paced_rate) for nodes in sizes if nodes > args.paced_rate]
    for rnd in range(1, args.repeat + 1):
        for db in dbs:
            for nodes, interval_s in configs:
                for label, tree in trees:
                    log(f"round {rnd}: {db}, {nodes} nodes every {interval_s:g} s, controller from {label} "
                        f"(warm-up {warmup:g} s, window {window:g} s)")
                    CONTROLLER_CWD = tree
                    result = run_config(db, nodes, interval_s, warmup, window, status_times)
                    result.update(round=rnd, controller_tree=label)
                    runs.append(result)
                    log(f"  p50 {result['latency_ms']['p50']} ms, p99 {result['latency_ms']['p99']} ms, "
                        f"{result['achieved_rate_per_s']}/{result['target_rate_per_s']:.0f} beats/s, "
                        f"controller {result['controller_cpu_ms_per_heartbeat']} ms CPU/beat")
    summary = summarize(runs, min(sizes), max(sizes)) if len(sizes) > 1 else {}
    meta["load_avg_at_end"] = os.getloadavg()
    meta["python_import_cli_s"] = round(python_startup_s(status_times), 4)
    print_table(runs)
    print(json.dumps(summary, indent=2))
    out = {"command": "python benchmarks/controller_scale.py " + " ".join(sys.argv[1:]), "machine": meta,
           "settings": {"heartbeat_interval_s": INTERVAL_S, "paced_rate": args.paced_rate, "warmup_s": warmup, "window_s": window,
                        "status_repeats": status_times, "engines_per_node": 2, "assigned_engines_per_node": 1},
           "runs": runs, "summary": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
