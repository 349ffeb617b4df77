"""Real processes for the gateway's process-level tests, on loopback: tiny reference engines
(`python -m engine.reference`, as tests/engine/conftest.py starts them), gateways (`fleetctl gateway serve`)
and a controller (`fleetctl controller serve` on SQLite). Each is stopped by PID; `Launcher` stops every
process it started when its fixture ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from agent.ports import free_port, port_is_free
# the gateway tests' metric helpers: scrape(text) -> {name: [Sample]}, metric_value(samples, name, **labels)
from engine.contract.prometheus import parse_samples as scrape  # noqa: F401
from engine.contract.prometheus import sum_series as metric_value  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 240.0  # model or tokenizer load on a busy 2-core machine
TINY_FLAGS = ("--model", "tiny", "--kv-cache-mib", "16", "--num-threads", "1", "--log-level", "warning")


def free_port_pair() -> int:
    """A port P with P+1 free too (KV events PUB and its replay socket)."""
    while True:
        port = free_port()
        if port < 65535 and port_is_free(port + 1):
            return port


def wait_until(probe: Callable[[], object], timeout_s: float, what: str, every_s: float = 0.1) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {value!r}")
        time.sleep(every_s)


@dataclass
class Proc:
    """A started process serving HTTP on `port`."""

    proc: subprocess.Popen
    port: int
    log_path: Path
    name: str
    extra: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def get(self, path: str, **kwargs) -> httpx.Response:
        return httpx.get(self.url + path, timeout=kwargs.pop("timeout", 30.0), **kwargs)

    def post(self, path: str, json: dict | None = None, **kwargs) -> httpx.Response:
        return httpx.post(self.url + path, json=json, timeout=kwargs.pop("timeout", 60.0), **kwargs)

    def metrics(self) -> dict[str, list]:
        return scrape(self.get("/metrics").text)

    def metric(self, name: str, **labels: str) -> float:
        return metric_value(self.metrics(), name, **labels)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_ready(self, path: str = "/health", timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} on port {self.port} not ready after {timeout_s}s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def _spawn(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log_path, "wb") as log:
        return subprocess.Popen(args, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})


class Launcher:
    """Starts engines, gateways and controllers for one fixture; `stop_all()` stops them by PID."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.started: list[Proc] = []

    def _start(self, name: str, args: list[str], port: int, env: dict[str, str] | None = None) -> Proc:
        log_path = self.log_dir / f"{name}-{port}.log"
        proc = Proc(_spawn(args, log_path, env), port, log_path, name)
        self.started.append(proc)
        return proc

    def engine(self, *flags: str, kv_events: bool = False, wait: bool = True) -> Proc:
        port = free_port()
        args = [sys.executable, "-m", "engine.reference", *TINY_FLAGS, "--port", str(port), *flags]
        extra = {}
        if kv_events:
            pub = free_port_pair()
            args += ["--kv-events-endpoint", f"tcp://127.0.0.1:{pub}", "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{pub + 1}"]
            extra["kv_events"] = f"tcp://127.0.0.1:{pub}"
        proc = self._start("engine", args, port)
        proc.extra = extra
        if wait:
            proc.wait_ready()
        return proc

    def gateway(self, *args: str, wait: bool = True, env: dict[str, str] | None = None) -> Proc:
        port = free_port()
        argv = [sys.executable, "-m", "fleetctl.cli.main", "gateway", "serve", "--port", str(port),
                "--log-level", "info", *args]
        proc = self._start("gateway", argv, port, env)
        if wait:
            proc.wait_ready()
        return proc

    def controller(self, state_dir: Path, token: str, db_url: str | None = None) -> Proc:
        """`fleetctl controller serve` on SQLite in `state_dir`, or on `db_url`."""
        port = free_port()
        argv = [sys.executable, "-m", "fleetctl.cli.main", "controller", "serve", "--state-dir", str(state_dir),
                "--port", str(port), "--log-level", "warning"]
        env = {"FLEET_BOOTSTRAP_TOKEN": token, **({"FLEET_DB_URL": db_url} if db_url else {})}
        proc = self._start("controller", argv, port, env)
        proc.wait_ready("/healthz")
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            proc.stop()


def static_entry(engine: Proc, role: str | None = None) -> str:
    """The `--engines` entry for an engine started by Launcher.engine."""
    options = []
    if role:
        options.append(f"role={role}")
    if engine.extra.get("kv_events"):
        options.append(f"kv_events={engine.extra['kv_events']}")
    return engine.url + ("?" + "&".join(options) if options else "")


def served_by(response: httpx.Response) -> str:
    """The engine name in x-fleet-served-by: "<class_ref> <engine>"."""
    return response.headers["x-fleet-served-by"].split(" ", 1)[1]
