"""Canary probe traffic through a real gateway in front of a real tiny engine: a request marked with
x-fleet-probe is served like any other (the engine's `fleet` extension reaches the client, in JSON and in a
stream's usage chunk) but leaves the user-facing request and latency metrics and the per-class-revision
counters untouched; it is counted in fleet_gateway_probe_*_total instead. A bad probe kind is a 400."""

from __future__ import annotations

import json

import httpx
import pytest

from engine.contract.faults import PROBE_HEADER, RESPONSE_EXTENSION
from gateway.procs import Launcher, Proc, metric_value, static_entry

BODY = {"model": "tiny", "prompt": "The river runs past the stone", "max_tokens": 5, "temperature": 0,
        "ignore_eos": True}
CLASS = "static@r1"
# Every user-facing series a probe must leave alone.
USER_FACING = (
    ("fleet_gateway_requests_total", {}),
    ("fleet_gateway_request_seconds_count", {}),
    ("fleet_gateway_ttft_seconds_count", {}),
    ("fleet_gateway_added_latency_seconds_count", {}),
    ("fleet_gateway_class_requests_total", {"class_ref": CLASS}),
    ("fleet_gateway_class_ttft_seconds_count", {"class_ref": CLASS}),
    ("fleet_gateway_class_itl_seconds_count", {"class_ref": CLASS}),
)


@pytest.fixture(scope="module")
def gateway(launcher: Launcher) -> Proc:
    engine = launcher.engine()
    return launcher.gateway("--engines", static_entry(engine))


def user_facing(gateway: Proc) -> dict[str, float]:
    samples = gateway.metrics()
    return {name: metric_value(samples, name, **labels) for name, labels in USER_FACING}


def probes(gateway: Proc, kind: str, type_: str | None = None) -> float:
    samples = gateway.metrics()
    if type_ is None:
        return metric_value(samples, "fleet_gateway_probe_requests_total", kind=kind, class_ref=CLASS, model="tiny")
    return metric_value(samples, "fleet_gateway_probe_tokens_total", kind=kind, type=type_, class_ref=CLASS)


def complete(gateway: Proc, headers: dict[str, str]) -> dict:
    response = gateway.post("/v1/completions", BODY, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def stream(gateway: Proc, headers: dict[str, str]) -> list[dict]:
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 200
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]


def test_user_requests_count_in_the_user_facing_metrics(gateway: Proc) -> None:
    before = user_facing(gateway)
    complete(gateway, {})
    stream(gateway, {})
    after = user_facing(gateway)
    assert after["fleet_gateway_requests_total"] == before["fleet_gateway_requests_total"] + 2
    assert after["fleet_gateway_class_requests_total"] == before["fleet_gateway_class_requests_total"] + 2
    assert after["fleet_gateway_ttft_seconds_count"] == before["fleet_gateway_ttft_seconds_count"] + 1
    assert after["fleet_gateway_added_latency_seconds_count"] == before["fleet_gateway_added_latency_seconds_count"] + 2
    assert after["fleet_gateway_class_itl_seconds_count"] == before["fleet_gateway_class_itl_seconds_count"] + 1


@pytest.mark.parametrize("kind", ["pinned", "production", "filler"])
def test_probes_are_served_but_counted_only_as_probes(gateway: Proc, kind: str) -> None:
    before, requests_before = user_facing(gateway), probes(gateway, kind)
    prompt_before, completion_before = probes(gateway, kind, "prompt"), probes(gateway, kind, "completion")
    headers = {PROBE_HEADER: kind}
    body = complete(gateway, headers)
    chunks = stream(gateway, headers)
    assert body["choices"][0]["text"] == "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert user_facing(gateway) == before
    assert probes(gateway, kind) == requests_before + 2
    prompt_tokens = body["usage"]["prompt_tokens"]
    assert probes(gateway, kind, "prompt") == prompt_before + 2 * prompt_tokens
    assert probes(gateway, kind, "completion") == completion_before + 2 * BODY["max_tokens"]


def test_the_engines_fleet_extension_reaches_the_client(gateway: Proc) -> None:
    for headers in ({}, {PROBE_HEADER: "pinned"}):
        body = complete(gateway, headers)
        assert set(body[RESPONSE_EXTENSION]) == {"batch_size_min", "batch_size_max"}
        assert body[RESPONSE_EXTENSION]["batch_size_min"] >= 1
        usage_chunk = stream(gateway, headers)[-1]
        assert usage_chunk["usage"] is not None
        assert set(usage_chunk[RESPONSE_EXTENSION]) == {"batch_size_min", "batch_size_max"}


def test_an_unknown_probe_kind_is_refused_naming_the_header(gateway: Proc) -> None:
    before = user_facing(gateway)
    response = gateway.post("/v1/completions", BODY, headers={PROBE_HEADER: "canary"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == PROBE_HEADER
    assert PROBE_HEADER in response.json()["error"]["message"]
    assert user_facing(gateway)["fleet_gateway_class_requests_total"] == before["fleet_gateway_class_requests_total"]
