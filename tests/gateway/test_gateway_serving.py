"""The gateway in front of two real tiny engines (with KV events), as clients and operators use it: the
openai SDK, bad requests, API keys, prefix locality with the hot-spot guard, route explain, metrics, and
a client that goes away."""

from __future__ import annotations

import json
import socket
from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest
from typer.testing import CliRunner

from engine.contract.faults import PIN_ENGINE_HEADER, PROBE_HEADER
from fleetctl.cli.main import app as fleetctl_cli
from gateway.procs import Launcher, Proc, metric_value, scrape, served_by, static_entry, wait_until

KEY = "sk-test-main"
SLOW_KEY = "sk-test-slow"
PROBE_KEY = "sk-test-probe"
AUTH = {"Authorization": f"Bearer {KEY}"}
WORDS = "river stone cloud maple lantern copper violet harbor meadow thunder quiet orbit".split()


def long_text(seed: int, n_words: int) -> str:
    """A deterministic text of n_words words, different for each seed."""
    return " ".join(WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] + str((seed + i) % 10) for i in range(n_words))


@pytest.fixture(scope="module")
def engines(launcher: Launcher) -> list[Proc]:
    return [launcher.engine(kv_events=True), launcher.engine(kv_events=True)]


@pytest.fixture(scope="module")
def gateway(launcher: Launcher, engines: list[Proc], tmp_path_factory: pytest.TempPathFactory) -> Proc:
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"# name:key:rps\nmain:{KEY}:0\nslow:{SLOW_KEY}:1\ncanary:{PROBE_KEY}:0:probe\n")
    entries = ",".join(static_entry(e) for e in engines)
    return launcher.gateway("--engines", entries, "--api-keys-file", str(keys))


@pytest.fixture(scope="module")
def sdk(gateway: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0)


def engine_names(engines: list[Proc]) -> set[str]:
    return {e.url.removeprefix("http://") for e in engines}


# --- the OpenAI API --------------------------------------------------------------------------------------


def test_models_lists_the_discovered_model(sdk: openai.OpenAI) -> None:
    assert [m.id for m in sdk.models.list()] == ["tiny"]


def test_openai_sdk_streams_chat_through_the_gateway(sdk: openai.OpenAI, engines: list[Proc]) -> None:
    messages = [{"role": "user", "content": "Tell me about mountains."}]
    whole = sdk.chat.completions.with_raw_response.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                                          extra_body={"ignore_eos": True})
    assert served_by(whole) in engine_names(engines)
    assert whole.headers["x-fleet-served-by"].startswith("static@r1 ")
    assert whole.headers["x-request-id"]
    stream = sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0, stream=True,
                                         stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.parse().choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6


def test_openai_sdk_streams_completions(sdk: openai.OpenAI) -> None:
    stream = sdk.completions.create(model="tiny", prompt="The sea is", max_tokens=5, temperature=0, stream=True,
                                    extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == sdk.completions.create(
        model="tiny", prompt="The sea is", max_tokens=5, temperature=0, extra_body={"ignore_eos": True}).choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_request_id_is_echoed_and_served_by_is_set(gateway: Proc) -> None:
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, headers={**AUTH, "x-request-id": "abc-123"},
                      timeout=30) as response:
        lines = [line for line in response.iter_lines() if line]
        assert response.headers["x-request-id"] == "abc-123"
        assert response.headers["x-fleet-served-by"].startswith("static@r1 127.0.0.1:")
    assert lines[-1] == "data: [DONE]"


def test_a_session_sticks_to_its_engine(gateway: Proc, engines: list[Proc]) -> None:
    body = {"model": "tiny", "prompt": "session turn", "max_tokens": 2}
    names = [served_by(gateway.post("/v1/completions", body, headers={**AUTH, "x-session-id": "conversation-7"}))
             for _ in range(4)]
    assert len(set(names)) == 1 and names[0] in engine_names(engines)
    explained = gateway.post("/fleet/route/explain", body, headers={**AUTH, "x-session-id": "conversation-7"}).json()
    assert explained["candidates"][0]["engine"] == names[0]  # without the session, equal engines would alternate


# --- bad requests ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "status", "param", "words"), [
    (b"{not json", 400, "body", "not valid JSON"),
    ({"model": "nope", "prompt": "hi"}, 404, "model", "does not exist"),
    ({"model": "tiny", "prompt": "hi", "temperature": -1}, 400, "temperature", "greater than or equal"),
    ({"model": "tiny", "prompt": "hi", "top_p": 7}, 400, "top_p", "less than or equal"),
    ({"model": "tiny", "prompt": "hi", "max_tokens": 0}, 400, "max_tokens", "greater than or equal"),
    ({"model": "tiny", "prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream_options", "stream"),
    ({"model": "tiny", "prompt": "hi", "max_tokens": 5000}, 400, "max_tokens", "context window of 2048"),
    ({"model": "tiny", "prompt": "word " * 2100}, 400, "prompt", "context window of 2048"),
    ({"model": "tiny"}, 400, "prompt", "prompt"),
])
def test_bad_requests_are_4xx_naming_the_problem(gateway: Proc, body: object, status: int, param: str, words: str) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{gateway.url}/v1/completions", content=content, headers={**AUTH, "content-type": "application/json"},
                          timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert set(error) == {"message", "type", "param", "code"}


def test_chat_with_a_prompt_too_long_names_messages(gateway: Proc) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "word " * 2100}]}
    response = gateway.post("/v1/chat/completions", body, headers=AUTH)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"


def test_pinning_an_unknown_class_is_400(gateway: Proc) -> None:
    response = gateway.post("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1},
                            headers={**AUTH, "x-fleet-pin-class": "ghost@r9"})
    assert response.status_code == 400
    assert "ghost@r9" in response.json()["error"]["message"]


# --- API keys ------------------------------------------------------------------------------------------------


def test_api_keys_are_required_and_rate_limited(gateway: Proc) -> None:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
    missing = gateway.post("/v1/completions", body)
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "AuthenticationError"
    wrong = gateway.post("/v1/completions", body, headers={"Authorization": "Bearer sk-nope"})
    assert wrong.status_code == 401 and "sk-nope" not in wrong.text
    slow = {"Authorization": f"Bearer {SLOW_KEY}"}
    codes = [gateway.post("/v1/completions", body, headers=slow) for _ in range(3)]
    limited = [r for r in codes if r.status_code == 429]
    assert codes[0].status_code == 200 and limited, [r.status_code for r in codes]
    assert int(limited[0].headers["Retry-After"]) >= 1
    assert gateway.get("/health").status_code == 200  # health and metrics need no key
    samples = gateway.metrics()
    assert metric_value(samples, "fleet_gateway_rate_limited_total", key="slow") >= 1
    assert KEY not in gateway.log_path.read_text() and SLOW_KEY not in gateway.log_path.read_text()


def test_only_a_probe_key_may_mark_a_request_as_a_canary_probe(gateway: Proc) -> None:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
    before = metric_value(gateway.metrics(), "fleet_gateway_requests_total")
    spoofed = gateway.post("/v1/completions", body, headers={"Authorization": f"Bearer {KEY}", PROBE_HEADER: "pinned"})
    assert spoofed.status_code == 403 and spoofed.json()["error"]["param"] == PROBE_HEADER
    assert "probe key" in spoofed.json()["error"]["message"] and KEY not in spoofed.text
    probe = gateway.post("/v1/completions", body, headers={"Authorization": f"Bearer {PROBE_KEY}", PROBE_HEADER: "pinned"})
    assert probe.status_code == 200, probe.text
    assert metric_value(gateway.metrics(), "fleet_gateway_requests_total") == before + 1  # the refusal, not the probe
    user = gateway.post("/v1/completions", body, headers={"Authorization": f"Bearer {PROBE_KEY}"})
    assert user.status_code == 200  # a probe key may send ordinary requests too


# --- prefix locality and the hot-spot guard -------------------------------------------------------------------


def explain(gateway: Proc, prompt: str) -> dict:
    response = gateway.post("/fleet/route/explain", {"model": "tiny", "prompt": prompt, "max_tokens": 1})
    assert response.status_code == 200, response.text
    return response.json()


def cached_on(gateway: Proc, prompt: str, min_blocks: int) -> str | None:
    """The engine the gateway's index says holds at least min_blocks leading blocks of the prompt."""
    for row in explain(gateway, prompt)["candidates"]:
        if row["cached_blocks"] >= min_blocks:
            return row["engine"]
    return None


def send(gateway: Proc, prompt: str) -> str:
    response = gateway.post("/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 1})
    assert response.status_code == 200, response.text
    return served_by(response)


def prefix_hits(engines: list[Proc]) -> dict[str, float]:
    return {e.url.removeprefix("http://"): e.metric("vllm:prefix_cache_hits_total") for e in engines}


def test_shared_prefixes_go_to_the_engine_holding_them_and_a_hot_prefix_spreads(launcher: Launcher, engines: list[Proc]) -> None:
    # A gateway of its own: fresh traffic shares, an open door (no keys), and no prefix warming, which would put
    # the hot prefix on the other engine ahead of the guard's spill (the next test covers warming).
    gateway = launcher.gateway("--engines", ",".join(static_entry(e) for e in engines), "--warm-prefix-requests", "0")
    prefix_a, prefix_b = long_text(1, 160), long_text(2, 160)  # ~20 blocks each
    first_a = send(gateway, prefix_a + " first")
    holder_a = wait_until(lambda: cached_on(gateway, prefix_a + " probe", 10), 20, "the index to learn prefix A")
    assert holder_a == first_a
    first_b = send(gateway, prefix_b + " first")
    assert first_b != first_a  # equal scores: the engine with the lower recent share
    wait_until(lambda: cached_on(gateway, prefix_b + " probe", 10) == first_b, 20, "the index to learn prefix B")

    hits_before = prefix_hits(engines)
    for i in range(2):
        assert send(gateway, prefix_a + f" again {i}") == first_a
        assert send(gateway, prefix_b + f" again {i}") == first_b
    hits_after = prefix_hits(engines)
    assert hits_after[first_a] - hits_before[first_a] >= 2 * 150  # the shared blocks were reused there
    assert hits_after[first_b] - hits_before[first_b] >= 2 * 150

    # One hot prefix: its engine's share rises above the guard's limit and traffic spills to the other.
    hot = Counter(send(gateway, prefix_a + f" hot {i}") for i in range(12))
    assert hot[first_a] >= 1 and hot[first_b] >= 1, hot
    reasons = {s.labels["reason"] for s in gateway.metrics()["fleet_gateway_routed_total"] if s.value}
    assert {"prefix", "hot_spot"} <= reasons, reasons


def test_a_popular_prefix_is_warmed_on_the_idle_engine(launcher: Launcher, engines: list[Proc]) -> None:
    gateway = launcher.gateway("--engines", ",".join(static_entry(e) for e in engines), "--engines-own-hardware",
                               "--warm-prefix-requests", "1.5", "--warm-min-blocks", "4",
                               "--hot-spot-damping", "1")  # no guard: the holder keeps the prefix's requests
    prefix = long_text(7, 160)  # ~20 blocks
    holder = send(gateway, prefix + " first")
    other = next(name for name in engine_names(engines) if name != holder)
    wait_until(lambda: cached_on(gateway, prefix + " probe", 10) == holder, 20, "the index to learn the prefix")
    for _ in range(3):  # explaining is not traffic: one request began with the prefix, under the threshold
        assert explain(gateway, prefix + " explained")["warm"] is None
    assert send(gateway, prefix + " second") == holder  # the second request: now the prefix is popular
    # planned once the gateway's view of the other engine (probed each second) shows it idle
    plan = wait_until(lambda: explain(gateway, prefix + " third")["warm"], 20, "a warm to be planned")
    assert plan["engine"] == other and plan["cached_blocks"] == 0 and plan["blocks"] >= 10

    assert send(gateway, prefix + " third") == holder  # the request itself stays with the holder ...
    wait_until(lambda: gateway.metric("fleet_gateway_prefix_warms_total", engine=other, outcome="ok") == 1, 30,
               "the warm to finish")  # ... while the idle engine prefills the prefix alone
    held = wait_until(lambda: {r["engine"]: r["cached_blocks"] for r in explain(gateway, prefix + " x")["candidates"]
                               if r["cached_blocks"] >= plan["blocks"]} or None, 20, "the index to learn the warm")
    assert set(held) == {holder, other}
    assert explain(gateway, prefix + " fourth")["warm"] is None  # both hold it: nothing left to warm
    routed = sum(s.value for s in gateway.metrics()["fleet_gateway_routed_total"])
    assert routed == 3  # a warm is not a routed request


def test_a_warm_yields_to_a_request_sent_to_its_engine(launcher: Launcher) -> None:
    """A warm in flight on an engine is cancelled when a request is sent there: the engine aborts it, the
    gateway counts it as yielded. Slow engines (a 100 ms step, 32 prompt tokens a step) keep the warm in
    flight for about a second, so the request can be sent while it is."""
    slow = ("--debug-step-delay-ms", "100", "--max-num-batched-tokens", "32")
    engines = [launcher.engine(*slow, kv_events=True), launcher.engine(*slow, kv_events=True)]
    gateway = launcher.gateway("--engines", ",".join(static_entry(e) for e in engines), "--engines-own-hardware",
                               "--warm-prefix-requests", "1.5", "--warm-min-blocks", "4", "--hot-spot-damping", "1")
    prefix = long_text(9, 160)  # ~20 blocks: ~10 steps to prefill
    holder = send(gateway, prefix + " first")
    other = next(e for e in engines if e.url.removeprefix("http://") != holder)
    other_name = other.url.removeprefix("http://")
    wait_until(lambda: cached_on(gateway, prefix + " probe", 10) == holder, 20, "the index to learn the prefix")
    assert send(gateway, prefix + " second") == holder  # now the prefix is popular
    aborted_before = other.metric("vllm:request_success_total", finished_reason="abort")
    with httpx.Client(timeout=60) as client:
        third = client.build_request("POST", f"{gateway.url}/v1/completions",
                                     json={"model": "tiny", "prompt": prefix + " third", "max_tokens": 1})
        sent = client.send(third, stream=True)  # to the holder; the warm goes to the other engine
        try:
            wait_until(lambda: other.metric("vllm:num_requests_running") >= 1, 20, "the warm to start")
            probe = client.post(f"{gateway.url}/v1/completions",
                                json={"model": "tiny", "prompt": "a short question", "max_tokens": 1},
                                headers={PROBE_HEADER: "pinned", PIN_ENGINE_HEADER: other_name})
            assert probe.status_code == 200, probe.text
            assert served_by(probe) == other_name
        finally:
            sent.read()
            sent.close()
    assert gateway.metric("fleet_gateway_prefix_warms_total", engine=other_name, outcome="yielded") == 1
    assert gateway.metric("fleet_gateway_prefix_warms_total", engine=other_name, outcome="ok") == 0
    wait_until(lambda: other.metric("vllm:request_success_total", finished_reason="abort") == aborted_before + 1,
               20, "the engine to abort the warm")


# --- route explain ---------------------------------------------------------------------------------------------


def test_route_explain_ranks_candidates_with_reasons(gateway: Proc, tmp_path: Path) -> None:
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(long_text(5, 60))
    runner = CliRunner()
    args = ["route", "explain", "--model", "tiny", "--prompt-file", str(prompt_file), "--gateway", gateway.url,
            "--api-key", KEY]
    as_json = runner.invoke(fleetctl_cli, [*args, "-o", "json"])
    assert as_json.exit_code == 0, as_json.output
    answer = json.loads(as_json.stdout)
    assert answer["class_ref"] == "static@r1" and answer["mode"] == "mixed"
    assert answer["num_prompt_tokens"] > 16 and answer["num_blocks"] == answer["num_prompt_tokens"] // 16
    assert [c["rank"] for c in answer["candidates"]] == [1, 2]
    assert all("blocks cached" in c["reason"] and isinstance(c["score"], float) for c in answer["candidates"])
    assert answer["admission"]["admit"] is True
    assert answer["cross_node"] is None  # a static table's class has no KV tiers
    assert all(c["tier_blocks"] == {} and c["tier_fetch_s"] == 0 for c in answer["candidates"])
    as_table = runner.invoke(fleetctl_cli, args)
    assert as_table.exit_code == 0 and "RANK" in as_table.stdout and "blocks cached" in as_table.stdout
    assert "TIER_FETCH_S" in as_table.stdout
    no_key = runner.invoke(fleetctl_cli, args[:-2])
    assert no_key.exit_code == 4 and "missing API key" in no_key.output  # ExitCode.AUTH


# --- metrics and cancellation ----------------------------------------------------------------------------------


def test_gateway_metrics_are_exposed(gateway: Proc, sdk: openai.OpenAI) -> None:
    list(sdk.completions.create(model="tiny", prompt="metrics", max_tokens=2, stream=True))
    assert gateway.post("/v1/completions", {"model": "nope", "prompt": "x"}, headers=AUTH).status_code == 404
    samples = gateway.metrics()
    for name in ("fleet_gateway_requests_total", "fleet_gateway_request_seconds_count", "fleet_gateway_ttft_seconds_count",
                 "fleet_gateway_added_latency_seconds_count", "fleet_gateway_routed_total", "fleet_gateway_table_age_seconds",
                 "fleet_gateway_admission_decisions_total", "fleet_gateway_engine_healthy"):
        assert name in samples, name
    assert metric_value(samples, "fleet_gateway_requests_total", model="tiny", code="200") > 0
    assert metric_value(samples, "fleet_gateway_requests_total", model="unknown", code="404") >= 1
    assert 0 <= metric_value(samples, "fleet_gateway_table_age_seconds") < 60


def running(engines: list[Proc]) -> float:
    return sum(metric_value(scrape(e.get("/metrics").text), "vllm:num_requests_running") for e in engines)


def test_a_client_that_goes_away_cancels_the_engine_request(gateway: Proc, engines: list[Proc]) -> None:
    body = {"model": "tiny", "prompt": "count", "max_tokens": 1900, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, headers=AUTH, timeout=30) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        assert running(engines) >= 1
    wait_until(lambda: running(engines) == 0, 20, "the engine to abort the request")
    # and a non-streamed request whose client goes away once the engine is working on it
    payload = json.dumps({**body, "stream": False}).encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                     + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
        wait_until(lambda: running(engines) >= 1, 20, "the request to start")
    wait_until(lambda: running(engines) == 0, 20, "the engine to abort the non-streamed request")
