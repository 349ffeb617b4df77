"""P/D through the gateway with real prefill and decode engines: greedy answers are token-for-token those of a
mixed engine, every handoff is measured, and the model falls back to whole-request serving by flag or when
its prefill engines are gone."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.procs import Launcher, Proc, metric_value, served_by, static_entry, wait_until

PROMPT = ("The history of the lighthouse begins with fires on hilltops, then towers of stone, then lenses that "
          "bent the light into a beam a ship could see from far away at night. ") * 3
MESSAGES = [{"role": "user", "content": PROMPT}]
GREEDY = {"model": "tiny", "max_tokens": 24, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engines(launcher: Launcher) -> dict[str, Proc]:
    return {"prefill": launcher.engine("--role", "prefill"), "decode": launcher.engine("--role", "decode"),
            "mixed": launcher.engine()}


@pytest.fixture(scope="module")
def pd_gateway(launcher: Launcher, engines: dict[str, Proc]) -> Proc:
    entries = f"{static_entry(engines['prefill'], 'prefill')},{static_entry(engines['decode'], 'decode')}"
    return launcher.gateway("--engines", entries)


@pytest.fixture(scope="module")
def mixed_gateway(launcher: Launcher, engines: dict[str, Proc]) -> Proc:
    return launcher.gateway("--engines", static_entry(engines["mixed"]))


def name(engine: Proc) -> str:
    return engine.url.removeprefix("http://")


def answer_text(response: httpx.Response, chat: bool, stream: bool) -> str:
    assert response.status_code == 200, response.text
    if not stream:
        choice = response.json()["choices"][0]
        return choice["message"]["content"] if chat else choice["text"]
    text = ""
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
    assert response.text.rstrip().endswith("data: [DONE]") and '"error"' not in response.text
    return text


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_greedy_pd_answers_equal_mixed_answers(pd_gateway: Proc, mixed_gateway: Proc, engines: dict[str, Proc],
                                               chat: bool, stream: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {**GREEDY, "stream": stream, **({"messages": MESSAGES} if chat else {"prompt": PROMPT})}
    via_pd = pd_gateway.post(path, body)
    via_mixed = mixed_gateway.post(path, body)
    assert served_by(via_pd) == name(engines["decode"])
    assert via_pd.headers["x-fleet-prefilled-by"] == name(engines["prefill"])
    assert served_by(via_mixed) == name(engines["mixed"]) and "x-fleet-prefilled-by" not in via_mixed.headers
    pd_text = answer_text(via_pd, chat, stream)
    assert pd_text == answer_text(via_mixed, chat, stream)
    assert len(pd_text) > 0


def test_every_handoff_is_measured(pd_gateway: Proc, engines: dict[str, Proc]) -> None:
    body = {**GREEDY, "prompt": PROMPT, "stream": True}
    assert pd_gateway.post("/v1/completions", body).status_code == 200
    samples = pd_gateway.metrics()
    handoffs = metric_value(samples, "fleet_gateway_pd_handoffs_total", model="tiny", result="ok")
    assert handoffs >= 1
    assert metric_value(samples, "fleet_gateway_pd_prefill_seconds_count", model="tiny") == handoffs
    assert metric_value(samples, "fleet_gateway_pd_queue_seconds_count", model="tiny") == handoffs
    assert metric_value(samples, "fleet_gateway_pd_decode_first_byte_seconds_count", model="tiny") >= 1
    assert metric_value(samples, "fleet_gateway_pd_kv_bytes_count", model="tiny") == handoffs
    assert metric_value(samples, "fleet_gateway_pd_kv_bytes_sum", model="tiny") > 0
    # the decode engine received the K/V, pushed as it was computed (push_to), and the gateway's scrape reports it
    assert engines["decode"].metric("fleet_kv_transfer_bytes_count", mode="push") >= 1
    wait_until(lambda: metric_value(pd_gateway.metrics(), "fleet_gateway_pd_transfer_seconds_count") >= 1, 10,
               "the gateway to see the decode engine's transfers")


def test_a_flag_turns_pd_off_for_the_model(launcher: Launcher, engines: dict[str, Proc], mixed_gateway: Proc) -> None:
    entries = f"{static_entry(engines['prefill'], 'prefill')},{static_entry(engines['decode'], 'decode')}"
    gateway = launcher.gateway("--engines", entries, "--flag", "pd_disaggregation:tiny=false")
    body = {**GREEDY, "prompt": PROMPT}
    response = gateway.post("/v1/completions", body)
    assert served_by(response) in {name(engines["prefill"]), name(engines["decode"])}
    assert "x-fleet-prefilled-by" not in response.headers
    assert answer_text(response, False, False) == answer_text(mixed_gateway.post("/v1/completions", body), False, False)
    explained = gateway.post("/fleet/route/explain", body).json()
    assert explained["mode"] == "mixed" and explained["fallback"] == "disabled by flag"
    assert metric_value(gateway.metrics(), "fleet_gateway_pd_fallbacks_total", reason="disabled by flag") >= 1


def test_without_a_prefill_engine_the_decode_engine_serves_whole_requests(pd_gateway: Proc, mixed_gateway: Proc,
                                                                          engines: dict[str, Proc]) -> None:
    engines["prefill"].kill()
    body = {**GREEDY, "prompt": PROMPT}
    response = pd_gateway.post("/v1/completions", body)
    assert served_by(response) == name(engines["decode"]) and "x-fleet-prefilled-by" not in response.headers
    assert answer_text(response, False, False) == answer_text(mixed_gateway.post("/v1/completions", body), False, False)
    samples = pd_gateway.metrics()
    fallbacks = sum(s.value for s in samples["fleet_gateway_pd_fallbacks_total"])
    assert fallbacks >= 1
    wait_until(lambda: pd_gateway.post("/fleet/route/explain", body).json()["fallback"] == "no healthy prefill engine",
               10, "the probe to take the prefill engine out")
