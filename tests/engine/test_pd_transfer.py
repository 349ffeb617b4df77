"""P/D disaggregation between real engine processes on loopback (tiny model, same seed everywhere).

Greedy output through prefill -> decode (pull over the side channel, pull over HTTP, push) must be
token-for-token the output of one mixed engine. A damaged transfer (corrupt, truncated, garbage, refused,
another prompt's K/V) on either transport makes the decode engine recompute and still answer correctly; with
kv_load_failure_policy "fail" it is a clear 502. An unreachable side channel falls back to HTTP."""

from __future__ import annotations

import concurrent.futures
import json
import math
import socket
import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from conftest import EngineProcess

BLOCK = 16
BYTES_PER_BLOCK = 2 * 2 * BLOCK * 2 * 16 * 4  # tiny: 2 layers, K and V, 2 KV heads of 16, float32
PROMPT_LENGTHS = [1, 5, 16, 17, 33, 40, 100]  # under a block, whole blocks, whole blocks + 1, ragged


def prompt_of(length: int, offset: int = 0) -> list[int]:
    return [(300 + 37 * i + offset) % 40000 + 100 for i in range(length)]


def greedy(prompt: list[int], **extra) -> dict:
    return {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "logprobs": 0,
            "return_tokens_as_token_ids": True, **extra}


def token_ids(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    tokens = response.json()["choices"][0]["logprobs"]["tokens"]
    return [int(t.removeprefix("token_id:")) for t in tokens]


def prefill(engine: EngineProcess, request: dict, **kv_params) -> dict:
    """The proxy's first leg: max_tokens 1 and do_remote_decode; returns the kv_transfer_params for decode."""
    response = engine.post("/v1/completions", {**request, "max_tokens": 1,
                                               "kv_transfer_params": {"do_remote_decode": True, **kv_params}})
    assert response.status_code == 200, response.text
    return response.json()["kv_transfer_params"]


@pytest.fixture(scope="module")
def mixed(launch_engine) -> EngineProcess:
    return launch_engine()


@pytest.fixture(scope="module")
def prefiller(launch_engine) -> EngineProcess:
    return launch_engine("--role", "prefill")


@pytest.fixture(scope="module")
def decoder(launch_engine) -> EngineProcess:
    return launch_engine("--role", "decode")


@pytest.fixture(scope="module")
def strict_decoder(launch_engine) -> EngineProcess:
    return launch_engine("--role", "decode", "--kv-load-failure-policy", "fail")


def transfer_counts(engine: EngineProcess) -> dict[str, float]:
    samples = engine.metrics()
    modes = ("pull", "push", "push+pull")
    counts = {mode: _value(samples, "fleet_kv_transfer_bytes_count", mode=mode) for mode in modes}
    counts["bytes"] = sum(_value(samples, "fleet_kv_transfer_bytes_sum", mode=mode) for mode in modes)
    counts["failures"] = _value(samples, "fleet_kv_transfer_failures_total")
    return counts


def _value(samples: dict, name: str, **labels: str) -> float:
    return sum(s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def needed_bytes(length: int) -> int:
    return math.ceil((length - 1) / BLOCK) * BYTES_PER_BLOCK


# --- the happy paths -----------------------------------------------------------------------------------


def test_prefill_response_carries_vllm_kv_transfer_params(prefiller: EngineProcess) -> None:
    params = prefill(prefiller, greedy(prompt_of(40)))
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert len(params["remote_block_ids"]) == 3 and params["num_tokens"] == 40
    assert params["remote_host"] == "127.0.0.1" and params["remote_port"] == prefiller.port
    assert isinstance(params["remote_kv_port"], int) and params["remote_kv_port"] not in (0, prefiller.port)
    assert params["remote_engine_id"] and params["remote_request_id"]
    httpx.post(f"{prefiller.url}/kv/release", json={"request_id": params["remote_request_id"]})
    prefiller.wait_idle()


def over_http(params: dict) -> dict:
    """The params without the side channel: the decode engine pulls over HTTP (as a vLLM-protocol peer would)."""
    return {k: v for k, v in params.items() if k != "remote_kv_port"}


@pytest.mark.parametrize("transport", ["side_channel", "http"])
@pytest.mark.parametrize("length", PROMPT_LENGTHS)
def test_pull_path_matches_a_mixed_engine(mixed: EngineProcess, prefiller: EngineProcess, decoder: EngineProcess,
                                          length: int, transport: str) -> None:
    request = greedy(prompt_of(length, offset=20 if transport == "http" else 0))
    expected = token_ids(mixed.post("/v1/completions", request))
    before = transfer_counts(decoder)
    params = prefill(prefiller, request)
    params = over_http(params) if transport == "http" else params
    assert token_ids(decoder.post("/v1/completions", {**request, "kv_transfer_params": params})) == expected
    after = transfer_counts(decoder)
    assert after["failures"] == before["failures"]
    assert after["pull"] - before["pull"] == (1 if length > 1 else 0)
    assert after["bytes"] - before["bytes"] == (needed_bytes(length) if length > 1 else 0)
    prefiller.wait_idle()  # pulled (or released) blocks are freed on the prefill engine
    decoder.wait_idle()


@pytest.mark.parametrize("length", [5, 17, 40, 100])
def test_push_path_matches_a_mixed_engine(mixed: EngineProcess, prefiller: EngineProcess, decoder: EngineProcess,
                                          length: int) -> None:
    request = greedy(prompt_of(length, offset=1))
    expected = token_ids(mixed.post("/v1/completions", request))
    before = transfer_counts(decoder)
    params = prefill(prefiller, request, push_to=decoder.url)
    assert token_ids(decoder.post("/v1/completions", {**request, "kv_transfer_params": params})) == expected
    after = transfer_counts(decoder)
    assert after["push"] - before["push"] == 1 and after["pull"] == before["pull"]
    assert after["bytes"] - before["bytes"] == needed_bytes(length)
    assert after["failures"] == before["failures"]
    prefiller.wait_idle()  # the decode engine released the held blocks it did not need to pull


def test_concurrent_handoffs_match_a_mixed_engine(mixed: EngineProcess, prefiller: EngineProcess,
                                                  decoder: EngineProcess) -> None:
    """Several prefills, then their pulls at once, over both transports: every answer is the mixed engine's."""
    requests = [greedy(prompt_of(17 + 13 * i, offset=30 + i)) for i in range(6)]
    expected = [token_ids(mixed.post("/v1/completions", r)) for r in requests]
    before = transfer_counts(decoder)
    params = [prefill(prefiller, r) for r in requests]
    params = [over_http(p) if i % 3 == 2 else p for i, p in enumerate(params)]
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda rp: decoder.post("/v1/completions", {**rp[0], "kv_transfer_params": rp[1]}),
                                zip(requests, params)))
    assert [token_ids(a) for a in answers] == expected
    after = transfer_counts(decoder)
    assert after["pull"] - before["pull"] == len(requests) and after["failures"] == before["failures"]
    prefiller.wait_idle()
    decoder.wait_idle()


def test_chat_through_pd_matches_a_mixed_engine(mixed: EngineProcess, prefiller: EngineProcess,
                                                decoder: EngineProcess) -> None:
    request = {"messages": [{"role": "user", "content": "Name three rivers in Europe, please."}], "max_tokens": 10,
               "temperature": 0, "ignore_eos": True}
    expected = mixed.post("/v1/chat/completions", request).json()["choices"][0]["message"]["content"]
    leg = {**request, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    params = prefiller.post("/v1/chat/completions", leg).json()["kv_transfer_params"]
    answer = decoder.post("/v1/chat/completions", {**request, "kv_transfer_params": params}).json()
    assert answer["choices"][0]["message"]["content"] == expected


def test_streaming_decode_matches(mixed: EngineProcess, prefiller: EngineProcess, decoder: EngineProcess) -> None:
    request = greedy(prompt_of(33, offset=2))
    expected = mixed.post("/v1/completions", request).json()["choices"][0]["text"]
    params = prefill(prefiller, request)
    body = decoder.post("/v1/completions", {**request, "stream": True, "kv_transfer_params": params}).text
    chunks = [line[6:] for line in body.split("\n\n") if line.startswith("data: {")]
    assert "".join(httpx.Response(200, content=c).json()["choices"][0]["text"] for c in chunks) == expected


@pytest.mark.parametrize("transport", ["side_channel", "http"])
def test_push_to_an_unreachable_decoder_falls_back_to_pull(mixed: EngineProcess, prefiller: EngineProcess,
                                                           decoder: EngineProcess, free_port, transport: str) -> None:
    """No frame is prepared for a pushing request: the pull exports its blocks when it arrives."""
    request = greedy(prompt_of(40, offset=3 if transport == "http" else 4))
    expected = token_ids(mixed.post("/v1/completions", request))
    before = transfer_counts(decoder)
    params = prefill(prefiller, request, push_to=f"http://127.0.0.1:{free_port()}")
    params = over_http(params) if transport == "http" else params
    assert token_ids(decoder.post("/v1/completions", {**request, "kv_transfer_params": params})) == expected
    after = transfer_counts(decoder)
    assert after["pull"] - before["pull"] == 1 and after["failures"] == before["failures"]
    prefiller.wait_idle()


def test_unreachable_side_channel_falls_back_to_http(mixed: EngineProcess, prefiller: EngineProcess,
                                                     decoder: EngineProcess, free_port) -> None:
    request = greedy(prompt_of(40, offset=5))
    expected = token_ids(mixed.post("/v1/completions", request))
    before = transfer_counts(decoder)
    params = {**prefill(prefiller, request), "remote_kv_port": free_port()}
    assert token_ids(decoder.post("/v1/completions", {**request, "kv_transfer_params": params})) == expected
    after = transfer_counts(decoder)
    assert after["pull"] - before["pull"] == 1 and after["failures"] == before["failures"]
    prefiller.wait_idle()


def test_side_channel_with_api_keys(launch_engine) -> None:
    """A P/D pair sharing a key pulls over the side channel; a side-channel pull without the key is refused
    (and does not consume the held blocks)."""
    key = "pd-key"
    prefill_engine = launch_engine("--role", "prefill", api_key=key)
    decode_engine = launch_engine("--role", "decode", api_key=key)
    request = greedy(prompt_of(40, offset=6))
    expected = token_ids(prefill_engine.post("/v1/completions", request))
    params = prefill(prefill_engine, request)
    body = {"version": 2, "request_id": params["remote_request_id"], "block_ids": params["remote_block_ids"][:2]}
    assert b"unauthorized" in side_channel_exchange(params["remote_kv_port"], body)
    before = transfer_counts(decode_engine)
    assert token_ids(decode_engine.post("/v1/completions", {**request, "kv_transfer_params": params})) == expected
    after = transfer_counts(decode_engine)
    assert after["pull"] - before["pull"] == 1 and after["failures"] == before["failures"]
    prefill_engine.wait_idle()


def side_channel_exchange(port: int, request: dict) -> bytes:
    """Send one raw side-channel request; everything the prefill engine answers, until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        raw = json.dumps(request).encode()
        sock.sendall(struct.pack("!I", len(raw)) + raw)
        return b"".join(iter(lambda: sock.recv(1 << 16), b""))


def test_unpulled_blocks_are_released_after_the_timeout(launch_engine) -> None:
    engine = launch_engine("--role", "prefill", "--kv-transfer-timeout-s", "0.5")
    params = prefill(engine, greedy(prompt_of(40, offset=4)))
    assert engine.metric("vllm:kv_cache_usage_perc") > 0  # held for a pull
    time.sleep(1.0)
    # The core frees expired blocks while idle without refreshing its gauges, so run one step to read them.
    engine.post("/v1/completions", {"prompt": [5], "max_tokens": 1})
    engine.wait_idle(timeout_s=10)
    pull = httpx.post(f"{engine.url}/kv/pull",
                      json={"request_id": params["remote_request_id"], "block_ids": params["remote_block_ids"]})
    assert pull.status_code == 400  # nothing left to pull


# --- damaged transfers ---------------------------------------------------------------------------------


class FakePrefill:
    """A prefill engine's /kv/* that serves whatever a test sets (damaged frames, errors)."""

    def __init__(self) -> None:
        self.body = b""
        self.status = 200
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length") or 0))
                body = fake.body if self.path == "/kv/pull" else b"{}"
                self.send_response(fake.status if self.path == "/kv/pull" else 200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def fake_prefill() -> Iterator[FakePrefill]:
    fake = FakePrefill()
    yield fake
    fake.close()


class FakeSideChannel:
    """A prefill engine's side channel that answers every pull with whatever a test sets, then closes."""

    def __init__(self) -> None:
        self.body = b""
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                (length,) = struct.unpack("!I", conn.recv(4, socket.MSG_WAITALL))
                conn.recv(length, socket.MSG_WAITALL)
                conn.sendall(self.body)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture(scope="module")
def fake_side_channel() -> Iterator[FakeSideChannel]:
    fake = FakeSideChannel()
    yield fake
    fake.close()


def redirect(params: dict, transport: str, fake_prefill: FakePrefill, fake_side_channel: FakeSideChannel) -> dict:
    """Params that send the decode engine's pull to the fake instead of the real prefill engine."""
    if transport == "http":
        return {**over_http(params), "remote_port": fake_prefill.port}
    return {**params, "remote_kv_port": fake_side_channel.port}


def genuine_frame(prefiller: EngineProcess, request: dict) -> tuple[dict, bytes]:
    """A real prefill's params and the real frame for the blocks decode needs (pulled by the test itself)."""
    params = prefill(prefiller, request)
    needed = math.ceil((len(request["prompt"]) - 1) / BLOCK)
    body = {"request_id": params["remote_request_id"], "block_ids": params["remote_block_ids"][:needed]}
    pulled = httpx.post(f"{prefiller.url}/kv/pull", json=body)
    assert pulled.status_code == 200
    return params, pulled.content


def flip_last_byte(frame: bytes) -> bytes:
    return frame[:-1] + bytes([frame[-1] ^ 0x40])


DAMAGE = {
    "flipped_byte": (flip_last_byte, "checksum"),
    "truncated": (lambda frame: frame[: len(frame) - 100], "truncated"),
    "garbage": (lambda frame: b"\x00\x00\x00\x10this is not a kv frame", "header"),
    "empty": (lambda frame: b"", "truncated"),
}


@pytest.mark.parametrize("transport", ["side_channel", "http"])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_pull_recomputes_the_right_answer(mixed: EngineProcess, prefiller: EngineProcess,
                                                  decoder: EngineProcess, fake_prefill: FakePrefill,
                                                  fake_side_channel: FakeSideChannel, damage: str,
                                                  transport: str) -> None:
    damage_fn, reason = DAMAGE[damage]
    request = greedy(prompt_of(40, offset=10))
    expected = token_ids(mixed.post("/v1/completions", request))
    params, frame = genuine_frame(prefiller, request)
    fake_prefill.body, fake_prefill.status = damage_fn(frame), 200
    fake_side_channel.body = damage_fn(frame)
    before = _value(decoder.metrics(), "fleet_kv_transfer_failures_total", reason=reason)
    redirected = redirect(params, transport, fake_prefill, fake_side_channel)
    assert token_ids(decoder.post("/v1/completions", {**request, "kv_transfer_params": redirected})) == expected
    assert _value(decoder.metrics(), "fleet_kv_transfer_failures_total", reason=reason) == before + 1


@pytest.mark.parametrize("transport", ["side_channel", "http"])
def test_the_undamaged_frame_through_the_fake_is_accepted(mixed: EngineProcess, prefiller: EngineProcess,
                                                          decoder: EngineProcess, fake_prefill: FakePrefill,
                                                          fake_side_channel: FakeSideChannel, transport: str) -> None:
    """Control for the damage tests: the same path with the frame intact is a successful pull."""
    request = greedy(prompt_of(40, offset=11))
    expected = token_ids(mixed.post("/v1/completions", request))
    params, frame = genuine_frame(prefiller, request)
    fake_prefill.body, fake_prefill.status = frame, 200
    fake_side_channel.body = frame
    before = transfer_counts(decoder)
    redirected = redirect(params, transport, fake_prefill, fake_side_channel)
    assert token_ids(decoder.post("/v1/completions", {**request, "kv_transfer_params": redirected})) == expected
    after = transfer_counts(decoder)
    assert after["pull"] == before["pull"] + 1 and after["failures"] == before["failures"]


def test_refused_connection_and_error_status_recompute(mixed: EngineProcess, prefiller: EngineProcess,
                                                       decoder: EngineProcess, fake_prefill: FakePrefill,
                                                       free_port) -> None:
    request = greedy(prompt_of(24, offset=12))
    expected = token_ids(mixed.post("/v1/completions", request))
    params = prefill(prefiller, request)
    refused = {**params, "remote_port": free_port(), "remote_kv_port": free_port()}  # side channel, then HTTP
    assert token_ids(decoder.post("/v1/completions", {**request, "kv_transfer_params": refused})) == expected
    fake_prefill.body, fake_prefill.status = b"", 500
    erroring = {**over_http(params), "remote_port": fake_prefill.port}
    assert token_ids(decoder.post("/v1/completions", {**request, "kv_transfer_params": erroring})) == expected
    samples = decoder.metrics()
    assert _value(samples, "fleet_kv_transfer_failures_total", reason="connect") >= 1
    assert _value(samples, "fleet_kv_transfer_failures_total", reason="status") >= 1
    # The decode engine sent its release to the address it was given; free the real prefill's blocks here.
    httpx.post(f"{prefiller.url}/kv/release", json={"request_id": params["remote_request_id"]})
    prefiller.wait_idle()


def test_kv_of_another_prompt_is_refused(mixed: EngineProcess, prefiller: EngineProcess,
                                         decoder: EngineProcess) -> None:
    request, other = greedy(prompt_of(40, offset=13)), greedy(prompt_of(40, offset=14))
    expected = token_ids(mixed.post("/v1/completions", other))
    params = prefill(prefiller, request)
    assert token_ids(decoder.post("/v1/completions", {**other, "kv_transfer_params": params})) == expected
    assert _value(decoder.metrics(), "fleet_kv_transfer_failures_total", reason="prompt") >= 1
    prefiller.wait_idle()  # the refused transfer's blocks were released


def test_fail_policy_is_a_clear_502_and_the_engine_keeps_serving(prefiller: EngineProcess,
                                                                 strict_decoder: EngineProcess,
                                                                 fake_prefill: FakePrefill) -> None:
    request = greedy(prompt_of(40, offset=15))
    params, frame = genuine_frame(prefiller, request)
    fake_prefill.body, fake_prefill.status = flip_last_byte(frame), 200
    redirected = {**over_http(params), "remote_port": fake_prefill.port}
    response = strict_decoder.post("/v1/completions", {**request, "kv_transfer_params": redirected})
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["type"] == "KVTransferError" and error["param"] == "kv_transfer_params"
    assert "checksum" in error["message"]
    assert token_ids(strict_decoder.post("/v1/completions", request))  # still serving
    strict_decoder.wait_idle()


def test_a_corrupt_push_is_refused(decoder: EngineProcess) -> None:
    response = httpx.post(f"{decoder.url}/kv/push", content=b"\x00\x00\x00\x02{}garbage")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "body"


def test_pull_of_blocks_not_held_is_refused(prefiller: EngineProcess) -> None:
    params = prefill(prefiller, greedy(prompt_of(40, offset=16)))
    foreign = max(params["remote_block_ids"]) + 1
    body = {"request_id": params["remote_request_id"], "block_ids": [foreign]}
    response = httpx.post(f"{prefiller.url}/kv/pull", json=body)
    assert response.status_code == 400
    unknown = httpx.post(f"{prefiller.url}/kv/pull", json={"request_id": "nobody", "block_ids": [0]})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "request_id"
    httpx.post(f"{prefiller.url}/kv/release", json={"request_id": params["remote_request_id"]})
    prefiller.wait_idle()
