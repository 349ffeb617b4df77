"""Steady load through the gateway, on threads, recording every request's outcome: HTTP status, whether a
stream was cut (an error event, a finish_reason "error", or no [DONE]), time to first token, and which
class revision and engines served it (`x-fleet-served-by: <class_ref> <engine>`, `x-fleet-prefilled-by`).

    with Load(fleet.gateway_url) as load:
        ...                                   # the rollout
    assert load.failures() == []

Bounded: each worker sends one request at a time, with a short pause between two, for at most
`max_requests` in all; every request has a timeout.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import httpx

SERVED_BY = "x-fleet-served-by"
PREFILLED_BY = "x-fleet-prefilled-by"
SERVED_BY_COMMENT = f": {SERVED_BY} "


@dataclass(frozen=True)
class Outcome:
    started: float  # time.monotonic() when sent
    status: int | None  # None: no HTTP answer (connection refused or reset, timeout)
    complete: bool  # a 200 whose stream ended with [DONE] and no error event (non-streamed: a parsed body)
    class_ref: str | None  # from x-fleet-served-by
    engine: str | None  # the (decode) engine that answered
    prefilled_by: str | None  # P/D: the prefill engine
    ttft_s: float | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.complete


def _served_by(value: str | None) -> tuple[str | None, str | None]:
    if not value:
        return None, None
    ref, _, engine = value.partition(" ")
    return ref or None, (engine if engine and engine != "-" else None)


def chat_body(stream: bool, max_tokens: int, index: int) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": f"count with me, round {index % 7}"}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": stream, "temperature": 0}


def send_one(client: httpx.Client, url: str, stream: bool, max_tokens: int, index: int) -> Outcome:
    started = time.monotonic()
    body = chat_body(stream, max_tokens, index)
    try:
        if not stream:
            response = client.post(f"{url}/v1/chat/completions", json=body)
            ref, engine = _served_by(response.headers.get(SERVED_BY))
            ok = response.status_code == 200 and bool(response.json().get("choices"))
            return Outcome(started, response.status_code, ok, ref, engine, response.headers.get(PREFILLED_BY),
                           time.monotonic() - started, "" if ok else response.text[:200])
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            return _read_stream(response, started)
    except (httpx.HTTPError, ValueError) as exc:
        return Outcome(started, None, False, None, None, None, None, f"{type(exc).__name__}: {exc}")


def _read_stream(response: httpx.Response, started: float) -> Outcome:
    ref, engine = _served_by(response.headers.get(SERVED_BY))
    if response.status_code != 200:
        response.read()
        return Outcome(started, response.status_code, False, ref, engine, response.headers.get(PREFILLED_BY), None,
                       response.text[:200])
    ttft, done, error = None, False, ""
    for line in response.iter_lines():
        if line.startswith(SERVED_BY_COMMENT):  # a stream that started before an engine was chosen
            ref, engine = _served_by(line[len(SERVED_BY_COMMENT):])
        elif line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            chunk = json.loads(line[6:])
            if "error" in chunk or any(c.get("finish_reason") == "error" for c in chunk.get("choices", [])):
                error = line[:200]
            elif ttft is None and chunk.get("choices"):
                ttft = time.monotonic() - started
    return Outcome(started, 200, done and not error, ref, engine, response.headers.get(PREFILLED_BY), ttft,
                   error or ("" if done else "stream ended without [DONE]"))


class Load:
    """`workers` threads sending chat completions to the gateway until stopped (or `max_requests` sent)."""

    def __init__(self, gateway_url: str, workers: int = 2, stream: bool = True, max_tokens: int = 6,
                 pause_s: float = 0.05, max_requests: int = 5_000, timeout_s: float = 60.0):
        self.url, self.stream, self.max_tokens, self.pause_s = gateway_url, stream, max_tokens, pause_s
        self.max_requests, self.timeout_s = max_requests, timeout_s
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, name=f"load-{i}", daemon=True) for i in range(workers)]

    def __enter__(self) -> "Load":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 5)
        return self.snapshot()

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)

    def since(self, at: float) -> list[Outcome]:
        """Outcomes of the requests sent at or after monotonic time `at`."""
        return [o for o in self.snapshot() if o.started >= at]

    def failures(self) -> list[Outcome]:
        return [o for o in self.snapshot() if not o.ok]

    def wait_for(self, count: int, timeout_s: float = 60.0) -> None:
        """Block until at least `count` requests have been answered (so the load is known to flow)."""
        deadline = time.monotonic() + timeout_s
        while len(self.snapshot()) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(self.snapshot())} of {count} requests answered in {timeout_s:.0f}s")
            time.sleep(0.1)

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            while not self._stop.is_set():
                with self._lock:
                    index = len(self.outcomes)
                    if index >= self.max_requests:
                        return
                outcome = send_one(client, self.url, self.stream, self.max_tokens, index)
                with self._lock:
                    self.outcomes.append(outcome)
                self._stop.wait(self.pause_s)


def describe(outcomes: list[Outcome]) -> str:
    """A short summary for an assertion message: counts by status and the first few failures."""
    by_status: dict[str, int] = {}
    for o in outcomes:
        key = f"{o.status}{'' if o.complete else ' (cut)'}"
        by_status[key] = by_status.get(key, 0) + 1
    bad = [f"{o.status} {o.class_ref} {o.error}" for o in outcomes if not o.ok][:5]
    return f"{len(outcomes)} requests: {by_status}; failures: {bad}"
