"""The rollout part of `make demo`: two rollouts of the demo model under live requests, each step the command
a user would type, run as a subprocess.

1. A revision with twice the batch limit (`max_num_seqs`, a performance-only change):
   `fleetctl class apply`, `fleetctl rollout start MODEL --to NAME@rN --steps 50,100 --pause 10s`, then
   `fleetctl rollout watch MODEL`, which exits 0 when the rollout completes.
2. A revision whose engines are made slow (the reference engine's test-only `debug-step-delay-ms`, which
   adds latency to every step and leaves the tokens alone), rolled out from a spec file whose analysis
   compares B's p90 inter-token latency with A's: the gate fails, the rollout aborts (`watch` exits 8) and
   `fleetctl traffic get MODEL` shows all traffic back on A.

Meanwhile a few client threads send streamed chat requests through the gateway (the gateway measures TTFT
and inter-token latency on streams) and count, per class revision, what was answered and what failed.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleetctl.localfleet.processes import child_env, fleetctl_argv

SLOW_STEP_MS = 300  # well past A's inter-token latency even on a busy machine
WORKERS = 3
WATCH_TIMEOUT = "180"  # seconds: a demo that goes wrong says so instead of hanging
QUESTIONS = ["Name a planet.", "What colour is the sky?", "Say hello in French.", "Count to five."]


class LiveRequests:
    """Closed-loop clients (WORKERS threads) sending short chat requests through the gateway until stopped."""

    def __init__(self, gateway: str, model: str, max_tokens: int = 16):
        self.gateway, self.model, self.max_tokens = gateway, model, max_tokens
        self.served: Counter[str] = Counter()  # class revision -> answered
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(WORKERS)]

    def __enter__(self) -> "LiveRequests":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def summary(self) -> str:
        with self._lock:
            served = ", ".join(f"{ref} {n}" for ref, n in sorted(self.served.items())) or "none"
            line = f"live requests: {sum(self.served.values())} answered ({served}), {len(self.failures)} failed"
            return line + (f"; first failure: {self.failures[0]}" if self.failures else "")

    def _loop(self, worker: int) -> None:
        with httpx.Client(timeout=120) as client:
            index = worker
            while not self._stop.is_set():
                self._one(client, QUESTIONS[index % len(QUESTIONS)])
                index += WORKERS

    def _one(self, client: httpx.Client, question: str) -> None:
        """One streamed request (the gateway measures TTFT and inter-token latency on streams)."""
        body = {"model": self.model, "messages": [{"role": "user", "content": question}],
                "max_tokens": self.max_tokens, "temperature": 0, "stream": True}
        try:
            with client.stream("POST", f"{self.gateway}/v1/chat/completions", json=body) as response:
                if response.status_code != 200:
                    self._record(None, f"HTTP {response.status_code}: {response.read().decode(errors='replace')[:120]}")
                    return
                served_by = response.headers.get("x-fleet-served-by", "?").split(" ")[0]
                self._record(served_by, _stream_failure(response.iter_lines()))
        except httpx.HTTPError as exc:
            self._record(None, f"{type(exc).__name__}: {exc}")

    def _record(self, served_by: str | None, failure: str | None) -> None:
        """An answer served by `served_by`, or a failure (counted apart from any revision)."""
        with self._lock:
            if failure is not None:
                self.failures.append(failure)
            else:
                self.served[served_by or "?"] += 1


def _stream_failure(lines: Iterator[str]) -> str | None:
    """Why a stream failed (an in-band error, or no [DONE]); None when it completed."""
    for line in lines:
        if line.startswith('data: {"error"'):
            return line[6:126]
        if line == "data: [DONE]":
            return None
    return "the stream ended before [DONE]"


def run_rollouts(fleet: dict[str, Any], env: dict[str, str], work_dir: Path) -> bool:
    """Both rollouts; True when the first completed and the second was aborted by its gate."""
    work_dir.mkdir(parents=True, exist_ok=True)
    model, class_ref = fleet["served_model"], fleet["class_ref"]
    name, spec_a = class_ref.split("@")[0], class_spec(class_ref, env)
    with LiveRequests(fleet["gateway_url"], model) as live:
        print(f"\n--- rollout 1: {class_ref} -> twice the batch limit, under live requests ---")
        spec_b = {**spec_a, "max_num_seqs": 2 * int(spec_a.get("max_num_seqs", 64))}
        ref_b = apply_class(work_dir / "class-batch.yaml", name, spec_b, env)
        run(["rollout", "start", model, "--to", ref_b, "--steps", "50,100", "--pause", "10s",
              "--reason", "demo: larger batch limit"], env)
        completed = run(["rollout", "watch", model, "--timeout", WATCH_TIMEOUT], env) == 0
        print(live.summary())

        print(f"\n--- rollout 2: {ref_b} -> engines made slow ({SLOW_STEP_MS} ms per step), gated on latency ---")
        spec_c = {**spec_b, "engine_args": {**spec_b.get("engine_args", {}), "debug-step-delay-ms": SLOW_STEP_MS}}
        ref_c = apply_class(work_dir / "class-slow.yaml", name, spec_c, env)
        spec_file = _write_yaml(work_dir / "rollout-slow.yaml", slow_rollout_spec(model, ref_c))
        print(f"\n# {spec_file}\n{spec_file.read_text()}", end="")
        run(["rollout", "start", "-f", str(spec_file), "--reason", "demo: a slow revision"], env)
        # --exit-on-pause: a gate that cannot decide says so at once instead of waiting out the timeout
        aborted = run(["rollout", "watch", model, "--timeout", WATCH_TIMEOUT, "--exit-on-pause"], env) == 8
        print("the gate aborted the rollout (watch exit 8)" if aborted else "the rollout was NOT aborted")
        print(live.summary())
    run(["traffic", "get", model], env)
    return completed and aborted


def slow_rollout_spec(model: str, to: str) -> dict[str, Any]:
    """Half the traffic to B, then an analysis of B's p90 inter-token latency against A's (failureLimit 0:
    the first failed measurement aborts). The client threads wait on B's slow streams, so a window can hold
    few of A's requests: 20 s windows, and one thin (inconclusive) window is let pass."""
    latency = {"metrics": [{"name": "itl", "measure": "itl_p90_s", "successCondition": "result <= 1.5 * baseline",
                            "interval": "20s", "count": 3, "failureLimit": 0, "inconclusiveLimit": 1,
                            "minRequests": 3}]}
    return {"model": model, "to": to, "steps": [{"scale": {}}, {"setWeight": 50}, {"analysis": {"templates": ["latency"]}},
                                                {"setWeight": 100}],
            "templates": {"latency": latency}}


def class_spec(ref: str, env: dict[str, str]) -> dict[str, Any]:
    result = subprocess.run(fleetctl_argv("class", "get", ref, "-o", "json"), stdout=subprocess.PIPE, text=True,
                            env=child_env(env), check=True)
    return json.loads(result.stdout)["spec"]


def apply_class(path: Path, name: str, spec: dict[str, Any], env: dict[str, str]) -> str:
    """`fleetctl class apply -f FILE`; the new revision's NAME@rN."""
    _write_yaml(path, {"name": name, "spec": spec})
    command = ["class", "apply", "-f", str(path), "--reason", "demo", "-o", "json"]
    print(f"\n$ fleetctl {' '.join(command)}", flush=True)
    result = subprocess.run(fleetctl_argv(*command), stdout=subprocess.PIPE, text=True, env=child_env(env), check=True)
    return json.loads(result.stdout)["ref"]


def _write_yaml(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def run(command: list[str], env: dict[str, str]) -> int:
    print(f"\n$ fleetctl {' '.join(command)}", flush=True)
    return subprocess.run(fleetctl_argv(*command), env=child_env(env), check=False).returncode
