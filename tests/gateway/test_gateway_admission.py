"""Admission control on predicted load: 429 with Retry-After when the predicted TTFT or the decode slots at the
time the request would reach decode break the SLO; admitted again once the work is gone.

The gateway has its own engine, so the class's prefill throughput stays at the configured default
(2,000 tokens/s) and predicted TTFT is prompt tokens / 2,000: a 0.05 s SLO admits ~100 tokens, not ~300."""

from __future__ import annotations

import httpx
import pytest

from gateway.procs import Launcher, Proc, metric_value, scrape, wait_until

SHORT = {"model": "tiny", "prompt": "hello there", "max_tokens": 4}


@pytest.fixture(scope="module")
def engine(launcher: Launcher) -> Proc:
    return launcher.engine()


@pytest.fixture(scope="module")
def gateway(launcher: Launcher, engine: Proc) -> Proc:
    return launcher.gateway("--engines", engine.url, "--ttft-slo-s", "0.05", "--max-decode-slots", "1")


def running(engine: Proc) -> float:
    return metric_value(scrape(engine.get("/metrics").text), "vllm:num_requests_running")


def test_a_prompt_predicted_to_miss_the_ttft_slo_is_refused(gateway: Proc) -> None:
    assert gateway.post("/v1/completions", SHORT).status_code == 200
    long_prompt = {"model": "tiny", "prompt": "word " * 300, "max_tokens": 4}
    response = gateway.post("/v1/completions", long_prompt)
    assert response.status_code == 429, response.text
    assert int(response.headers["Retry-After"]) >= 1
    error = response.json()["error"]
    assert error["type"] == "RateLimitError" and "predicted TTFT" in error["message"] and "SLO 0.05s" in error["message"]
    assert metric_value(gateway.metrics(), "fleet_gateway_admission_rejections_total", model="tiny", reason="ttft") == 1


def test_queued_decodes_that_would_fill_the_slots_are_refused_until_they_finish(gateway: Proc, engine: Proc) -> None:
    long_decode = {"model": "tiny", "prompt": "go", "max_tokens": 1900, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=long_decode, timeout=60) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()  # held: dropping the iterator would close the stream
        next(line for line in lines if line.startswith("data:"))
        refused = gateway.post("/v1/completions", SHORT)
        assert refused.status_code == 429, refused.text
        assert "decode slots 2/1" in refused.json()["error"]["message"]
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
    wait_until(lambda: running(engine) == 0, 20, "the abandoned stream to be aborted on the engine")
    # the gateway sees the slot free once its next probe of the engine does (a probe interval later)
    wait_until(lambda: gateway.post("/v1/completions", SHORT).status_code == 200, 20, "the request to be admitted again")
    samples = gateway.metrics()
    assert metric_value(samples, "fleet_gateway_admission_rejections_total", reason="decode_slots") >= 1
    assert metric_value(samples, "fleet_gateway_admission_decisions_total", decision="admit") >= 2


def test_admission_can_be_turned_off(launcher: Launcher, engine: Proc) -> None:
    gateway = launcher.gateway("--engines", engine.url, "--ttft-slo-s", "0.05", "--no-admission")
    response = gateway.post("/v1/completions", {"model": "tiny", "prompt": "word " * 300, "max_tokens": 2})
    assert response.status_code == 200
    assert metric_value(gateway.metrics(), "fleet_gateway_admission_decisions_total") == 0


def test_the_admission_control_flag_turns_it_off_and_shed_fraction_refuses_before_any_work(
        launcher: Launcher, engine: Proc) -> None:
    """The flags as the routing table carries them (static mode takes them on the command line)."""
    unadmitted = launcher.gateway("--engines", engine.url, "--ttft-slo-s", "0.05", "--flag", "admission_control=false")
    response = unadmitted.post("/v1/completions", {"model": "tiny", "prompt": "word " * 300, "max_tokens": 2})
    assert response.status_code == 200, response.text  # the SLO would refuse it (the first test)
    assert metric_value(unadmitted.metrics(), "fleet_gateway_admission_decisions_total") == 0
    shedding = launcher.gateway("--engines", engine.url, "--flag", "shed_fraction:tiny=1")
    before = metric_value(scrape(engine.get("/metrics").text), "vllm:request_success_total")
    refused = [shedding.post("/v1/completions", SHORT) for _ in range(3)]
    assert [r.status_code for r in refused] == [429] * 3 and {r.headers["Retry-After"] for r in refused} == {"2"}
    assert "shed_fraction" in refused[0].json()["error"]["message"]
    assert metric_value(shedding.metrics(), "fleet_gateway_shed_total", model="tiny") == 3
    assert metric_value(scrape(engine.get("/metrics").text), "vllm:request_success_total") == before  # no work done
    other_model = shedding.post("/v1/completions", {**SHORT, "model": "nope"})
    assert other_model.status_code == 404  # a model that does not exist is not "shed"
