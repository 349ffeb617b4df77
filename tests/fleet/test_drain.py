"""A drain under load drops nothing: requests in flight when an engine is drained (through the controller)
all complete; new ones are refused with 503 + Retry-After; the agent reports draining, then stopped; the
deployment's replacement engine comes up."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fleet_helpers import agents, controller, converged, engines_by_name, wait_until

from engine.contract.scrape import parse_engine_metrics

pytestmark = pytest.mark.slow

IN_FLIGHT = 8
MAX_TOKENS = 384


def generate(url: str, stream: bool) -> int:
    """One long completion; returns the tokens received (raises on any error)."""
    body = {"model": "tiny", "prompt": "drain me gently", "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": stream}
    if not stream:
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        response.raise_for_status()
        return response.json()["usage"]["completion_tokens"]
    body["stream_options"] = {"include_usage": True}
    tokens, done = 0, False
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: ") and (chunk := json.loads(line[6:])).get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    assert done, "the stream ended without [DONE]"
    return tokens


def in_flight(url: str) -> float:
    metrics = parse_engine_metrics(httpx.get(f"{url}/metrics", timeout=5).text)
    return metrics.num_requests_running + metrics.num_requests_waiting


class StateLog:
    """The drained engine's state as its agent reports it, sampled on a thread."""

    def __init__(self, fleet, node: str, engine: str):
        self.client, self.engine, self.states = agents(fleet)[node], engine, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            state = next((e["state"] for e in self.client.engines() if e["name"] == self.engine), "gone")
            if not self.states or self.states[-1] != state:
                self.states.append(state)
            time.sleep(0.05)

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.states


def test_drain_under_load_drops_nothing(tiny_fleet):
    wait_until(lambda: converged(tiny_fleet, replicas=2), 60, "2 ready engines")
    target = engines_by_name(tiny_fleet)["local-0"]
    log = StateLog(tiny_fleet, target["node"], "local-0")
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        futures = [pool.submit(generate, target["url"], i % 2 == 1) for i in range(IN_FLIGHT)]
        wait_until(lambda: in_flight(target["url"]) >= IN_FLIGHT, 30, "every request in flight", every_s=0.05)

        with controller(tiny_fleet) as api:
            api.drain_engine("local-0", reason="test: drain under load")
        wait_until(lambda: "draining" in log.states, 30, "the agent to report draining", every_s=0.05)
        refused = httpx.post(f"{target['url']}/v1/completions", json={"model": "tiny", "prompt": "late", "max_tokens": 4}, timeout=10)
        completed = [future.result(timeout=120) for future in futures]

    assert completed == [MAX_TOKENS] * IN_FLIGHT  # every in-flight request got its whole answer
    assert refused.status_code == 503 and refused.headers.get("retry-after")
    wait_until(lambda: "stopped" in log.states or "gone" in log.states, 60, "the drained engine to stop")
    states = log.stop()
    assert states[:2] == ["ready", "draining"] and states[2] in ("stopped", "gone"), states
    assert "failed" not in states

    # the controller drops the finished drain and the deployment is whole again on a replacement engine
    engines = wait_until(lambda: converged(tiny_fleet, replicas=2), 90, "the replacement to be ready")
    assert "local-0" not in engines and len(engines) == 2
    assert "local-0" not in engines_by_name(tiny_fleet)  # the agent forgot it once it was unassigned
