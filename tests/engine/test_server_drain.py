"""Draining a real engine process (SIGTERM or POST /drain): in-flight requests finish, new ones get 503 with
Retry-After, /health says 503, and the process exits 0; a request longer than the grace does not hold the
process forever."""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from conftest import EngineProcess

# ~1500 tokens on the tiny model take seconds: far longer than the few requests the test sends meanwhile.
LONG = {"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}


def assert_refused_while_draining(engine: EngineProcess) -> None:
    response = httpx.post(f"{engine.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["type"] == "ServiceUnavailableError"
    assert httpx.get(f"{engine.url}/v1/models").status_code == 503
    health = httpx.get(f"{engine.url}/health")
    assert health.status_code == 503 and "retry-after" in health.headers


def test_sigterm_lets_the_stream_finish_and_refuses_new_requests(launch_engine) -> None:
    engine = launch_engine("--drain-grace-s", "60")
    body = {**LONG, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.Client(base_url=engine.url, timeout=60) as client, \
            client.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        os.kill(engine.pid, signal.SIGTERM)
        assert_refused_while_draining(engine)
        events = [line[6:] for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["usage"]["completion_tokens"] == LONG["max_tokens"]
    assert engine.proc.wait(timeout=60) == 0


def test_post_drain_lets_the_request_finish_then_exits(launch_engine) -> None:
    engine = launch_engine("--drain-grace-s", "60")
    result: dict = {}
    in_flight = threading.Thread(target=lambda: result.update(
        response=httpx.post(f"{engine.url}/v1/completions", json=LONG, timeout=60)))
    in_flight.start()
    engine.wait_for(lambda s: sum(x.value for x in s["vllm:num_requests_running"]) == 1)
    drain = httpx.post(f"{engine.url}/drain")
    assert drain.status_code == 202 and drain.json()["in_flight"] == 1
    assert_refused_while_draining(engine)
    in_flight.join(60)
    assert result["response"].status_code == 200
    assert result["response"].json()["usage"]["completion_tokens"] == LONG["max_tokens"]
    assert engine.proc.wait(timeout=60) == 0


def test_the_grace_bounds_the_drain(launch_engine) -> None:
    engine = launch_engine("--drain-grace-s", "0.5", "--max-model-len", "8192")
    endless = {**LONG, "max_tokens": 8000, "stream": True}  # tens of seconds of decoding
    with httpx.Client(base_url=engine.url, timeout=60) as client, \
            client.stream("POST", "/v1/completions", json=endless) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        os.kill(engine.pid, signal.SIGTERM)
        assert engine.proc.wait(timeout=30) == 0
