"""Process-level fixtures: real reference-engine processes (`python -m engine.reference`) on loopback.

`launch_engine(*flags)` starts one on a free port, waits until /health answers 200 and returns an
`EngineProcess`; every process a test module started is stopped by PID when the module ends.
`tiny_engine` is one shared engine (tiny model, API key TEST_API_KEY) for tests that only send requests.
Helpers live on EngineProcess (metrics, wait_for) and in fixtures (`free_port`), so test modules never
import this file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from agent.ports import free_port
from engine.contract.prometheus import parse_samples, sum_series

REPO_ROOT = Path(__file__).resolve().parents[2]
TEST_API_KEY = "test-key-123"
READY_TIMEOUT_S = 240.0  # model load on a busy 2-core machine
# Small pool and one torch thread: several engines share two cores in a test run.
TINY_FLAGS = ("--model", "tiny", "--kv-cache-mib", "16", "--num-threads", "1", "--log-level", "warning")


@dataclass
class EngineProcess:
    proc: subprocess.Popen
    port: int
    log_path: Path
    api_key: str | None = None
    flags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def post(self, path: str, json: dict | None = None, **kwargs) -> httpx.Response:
        with self.client() as client:
            return client.post(path, json=json, **kwargs)

    def get(self, path: str, **kwargs) -> httpx.Response:
        with self.client() as client:
            return client.get(path, **kwargs)

    def metrics(self) -> dict[str, list]:
        """Samples by sample name (e.g. "vllm:prompt_tokens_total" -> [Sample, ...])."""
        return parse_samples(self.get("/metrics").text)

    def metric(self, name: str, **labels: str) -> float:
        return sum_series(self.metrics(), name, **labels)

    def wait_for(self, predicate: Callable[[dict[str, list]], bool], timeout_s: float = 30.0) -> dict[str, list]:
        """Poll /metrics until predicate(samples) holds; the samples, or AssertionError with the last ones."""
        deadline = time.monotonic() + timeout_s
        while True:
            samples = self.metrics()
            if predicate(samples):
                return samples
            if time.monotonic() > deadline:
                raise AssertionError(f"metrics never satisfied the condition: {_gauges(samples)}")
            time.sleep(0.1)

    def wait_idle(self, timeout_s: float = 30.0) -> dict[str, list]:
        """Until no request runs or waits and no KV block is in use."""
        return self.wait_for(lambda s: all(sum_series(s, name) == 0 for name in IDLE_GAUGES), timeout_s)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"engine on port {self.port} not ready after {timeout_s}s:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (the engine drains and exits), then SIGKILL if it does not; the exit code."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


IDLE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def _gauges(samples: dict[str, list]) -> dict[str, float]:
    return {name: sum_series(samples, name) for name in IDLE_GAUGES}


def start_engine(log_dir: Path, *flags: str, api_key: str | None = None, env: dict | None = None,
                 wait: bool = True) -> EngineProcess:
    port = free_port()
    log_path = log_dir / f"engine-{port}.log"
    args = [sys.executable, "-m", "engine.reference", *TINY_FLAGS, "--port", str(port), *flags]
    if api_key:
        args += ["--api-key", api_key]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
    engine = EngineProcess(proc, port, log_path, api_key, tuple(flags))
    if wait:
        try:
            engine.wait_ready()
        except BaseException:
            engine.stop(timeout_s=5)
            raise
    return engine


@pytest.fixture(name="free_port", scope="session")
def free_port_fixture() -> Callable[[], int]:
    return free_port


@pytest.fixture(name="metric_value", scope="session")
def metric_value_fixture() -> Callable[..., float]:
    """metric_value(samples, name, **labels): the summed value of matching series in a scrape."""
    return sum_series


@pytest.fixture(scope="module")
def launch_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., EngineProcess]]:
    """Start engines for this module; all of them are stopped (by PID) when the module ends."""
    started: list[EngineProcess] = []
    log_dir = tmp_path_factory.mktemp("engines")

    def launch(*flags: str, **kwargs) -> EngineProcess:
        engine = start_engine(log_dir, *flags, **kwargs)
        started.append(engine)
        return engine

    yield launch
    for engine in started:
        engine.stop()


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """One tiny engine shared by every module that only sends requests (API key TEST_API_KEY)."""
    engine = start_engine(tmp_path_factory.mktemp("shared-engine"), api_key=TEST_API_KEY)
    yield engine
    engine.stop()
