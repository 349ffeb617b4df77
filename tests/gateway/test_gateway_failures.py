"""Engines that die: before the first token the request succeeds on another engine; mid-stream the client
gets an error event and the end of the stream, never a hang."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from gateway.procs import Launcher, metric_value, served_by, static_entry, wait_until


def test_an_engine_killed_before_the_first_token_is_retried_elsewhere(launcher: Launcher) -> None:
    engines = [launcher.engine(), launcher.engine()]
    # Probes every minute: the gateway learns of the death from the failed request itself (passive health).
    gateway = launcher.gateway("--engines", ",".join(static_entry(e) for e in engines), "--probe-interval-s", "60")
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "ignore_eos": True}
    victim = engines[0]
    victim.kill()
    names = []
    for stream in (False, True, False, True):
        response = gateway.post("/v1/completions", {**body, "stream": stream})
        assert response.status_code == 200, response.text
        names.append(served_by(response))
        if stream:
            assert response.text.rstrip().endswith("data: [DONE]") and '"error"' not in response.text
    assert set(names) == {engines[1].url.removeprefix("http://")}
    samples = gateway.metrics()
    assert metric_value(samples, "fleet_gateway_retries_total", reason="connect") >= 1
    assert metric_value(samples, "fleet_gateway_routed_total", reason="retry") >= 1
    assert metric_value(samples, "fleet_gateway_engine_healthy", engine=victim.url.removeprefix("http://")) == 0
    health = gateway.get("/health").json()["engines"][victim.url.removeprefix("http://")]
    assert health["healthy"] is False and health["reason"] == "connect"


def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error(launcher: Launcher) -> None:
    engine = launcher.engine()
    gateway = launcher.gateway("--engines", static_entry(engine))
    body = {"model": "tiny", "prompt": "count", "max_tokens": 1900, "ignore_eos": True, "stream": True}
    events: list[str] = []
    # a hang would trip the client's read timeout: the stream must end by itself
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            events.append(line.removeprefix("data: "))
            if len(events) == 3:
                engine.kill()
    assert events[-1] == "[DONE]"
    error = json.loads(events[-3])["error"]
    assert error["code"] == 502 and "stream" in error["message"]
    final = json.loads(events[-2])
    assert final["choices"][0]["finish_reason"] == "error" and final["object"] == "text_completion"
    assert final["id"] == json.loads(events[0])["id"]  # the same stream's id
    wait_until(lambda: metric_value(gateway.metrics(), "fleet_gateway_stream_errors_total") >= 1, 10, "the stream error metric")


def test_the_openai_sdk_sees_the_mid_stream_error(launcher: Launcher) -> None:
    engine = launcher.engine()
    gateway = launcher.gateway("--engines", static_entry(engine))
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0)
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "go"}], max_tokens=1900,
                                            stream=True, extra_body={"ignore_eos": True})
    received = 0
    with pytest.raises(openai.APIError):
        for _ in stream:
            received += 1
            if received == 3:
                engine.kill()
    assert received >= 3
    # with no engine left, new requests are a clean 503 naming why, not a hang
    response = gateway.post("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1})
    assert response.status_code in (502, 503), response.text
    if response.status_code == 503:
        assert response.headers["Retry-After"] == "1" and "no healthy engine" in response.json()["error"]["message"]
