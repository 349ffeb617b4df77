"""Concurrent writers and deleters of one object get an answer, never a 500, on SQLite and PostgreSQL:
every mutation applies in one transaction or answers 409 (or 404 when the object is gone), and what is
stored afterwards is what one of the acknowledged writes wrote. Against a real controller on loopback
(uvicorn in a thread), with real concurrent HTTP clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetctl.controller.server import ServerThread
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import role_tokens

ROUNDS = 5
ANSWERS = {200, 201, 404, 409}
SPEC = {"model": "smollm2-135m", "weights": "smollm2"}


@pytest.fixture
def controller(db_url: str, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A controller on `db_url` (conftest: SQLite and PostgreSQL) served by uvicorn in a thread."""
    settings = ControllerSettings(db_url=db_url, state_dir=tmp_path / "state", port=0, reconcile_interval_s=0.2)
    with ServerThread(settings) as server:
        yield server.url, role_tokens(server.runtime.store)


def race(base: str, token: str, calls: list[tuple[str, str, dict[str, Any] | None]]) -> list[httpx.Response]:
    """Send every call at once, each from its own client."""
    headers = {"Authorization": f"Bearer {token}"}

    def send(call: tuple[str, str, dict[str, Any] | None]) -> httpx.Response:
        method, path, body = call
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            return client.request(method, path, json=body)

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(send, calls))


def statuses(responses: list[httpx.Response]) -> set[int]:
    return {r.status_code for r in responses}


def check_round(responses: list[httpx.Response], read: Callable[[], httpx.Response], stored: Callable[[dict[str, Any]], Any],
                written: Callable[[httpx.Response], Any]) -> None:
    """No 5xx; the stored state is what an acknowledged write left (or gone when a delete was acknowledged)."""
    unexpected = [(r.status_code, r.text) for r in responses if r.status_code not in ANSWERS]
    assert not unexpected, unexpected
    acknowledged = [written(r) for r in responses if r.status_code in (200, 201)]
    assert acknowledged, [(r.status_code, r.text) for r in responses]  # one of them always wins
    final = read()
    if final.status_code == 404:
        assert "deleted" in acknowledged
    else:
        assert final.status_code == 200, final.text
        assert stored(final.json()) in acknowledged


def test_deployment_writers_and_deleters(controller: tuple[str, dict[str, str]]) -> None:
    base, tokens = controller
    op = {"Authorization": f"Bearer {tokens['operator']}"}
    ref = httpx.post(f"{base}/api/v1/classes", json={"name": "chat", "spec": SPEC}, headers=op).json()["ref"]
    for _ in range(ROUNDS):
        calls = [("PUT", "/api/v1/deployments/race", {"class_ref": ref, "replicas": n % 3}) for n in range(6)]
        calls += [("DELETE", "/api/v1/deployments/race", None)] * 2
        responses = race(base, tokens["operator"], calls)
        check_round(responses, lambda: httpx.get(f"{base}/api/v1/deployments/race", headers=op),
                    stored=lambda view: view["replicas"],
                    written=lambda r: "deleted" if r.request.method == "DELETE" else r.json()["replicas"])


def test_flag_writers(controller: tuple[str, dict[str, str]]) -> None:
    base, tokens = controller
    op = {"Authorization": f"Bearer {tokens['operator']}"}
    for _ in range(ROUNDS):
        writes = [("PUT", "/api/v1/flags/shed_fraction:race", {"value": n / 10, "reason": "race"}) for n in range(6)]
        responses = race(base, tokens["operator"], writes)
        check_round(responses, lambda: _flag(base, op), stored=lambda view: view["value"],
                    written=lambda r: r.json()["value"])


def _flag(base: str, headers: dict[str, str]) -> httpx.Response:
    flags = httpx.get(f"{base}/api/v1/flags", headers=headers)
    body = flags.json().get("shed_fraction:race")
    return httpx.Response(200 if body else 404, json=body or {}, request=flags.request)


def test_class_appliers(controller: tuple[str, dict[str, str]]) -> None:
    base, tokens = controller
    op = {"Authorization": f"Bearer {tokens['operator']}"}
    for round_ in range(ROUNDS):
        calls = [("POST", "/api/v1/classes", {"name": "race", "spec": {**SPEC, "max_num_seqs": 8 + (round_ * 6 + n) % 4}})
                 for n in range(6)]
        responses = race(base, tokens["operator"], calls)
        assert statuses(responses) <= ANSWERS, [(r.status_code, r.text) for r in responses]
        history = httpx.get(f"{base}/api/v1/classes/race/history", headers=op).json()
        revisions = [entry["revision"] for entry in history]
        assert revisions == list(range(1, len(revisions) + 1))  # no gap, no duplicate


def test_traffic_writers(controller: tuple[str, dict[str, str]]) -> None:
    base, tokens = controller
    op = {"Authorization": f"Bearer {tokens['operator']}"}
    refs = [httpx.post(f"{base}/api/v1/classes", json={"name": "chat", "spec": {**SPEC, "max_num_seqs": n}},
                       headers=op).json()["ref"] for n in (8, 16)]
    serve_ready_engine(base, tokens["agent"], refs[0])
    for _ in range(ROUNDS):
        calls = [("PUT", "/api/v1/traffic/smollm2-135m", {"weights": {refs[0]: 1 + n, refs[1]: 0}}) for n in range(6)]
        responses = race(base, tokens["operator"], calls)
        check_round(responses, lambda: httpx.get(f"{base}/api/v1/traffic", headers=op),
                    stored=lambda view: view.get("smollm2-135m", {}).get("weights"),
                    written=lambda r: r.json()["weights"])


def serve_ready_engine(base: str, agent_token: str, class_ref: str) -> None:
    """A node reporting one ready engine of `class_ref` (the split guard wants one behind every weight)."""
    headers = {"Authorization": f"Bearer {agent_token}"}
    node = {"node": "n1", "url": "http://127.0.0.1:9", "capacity": {"engines": 1, "kv_mib": 16}, "labels": {}}
    assert httpx.post(f"{base}/api/v1/agents/register", json=node, headers=headers).status_code == 200
    engine = {"name": "e0", "model": "smollm2-135m", "class_ref": class_ref, "role": "mixed", "state": "ready",
              "pid": 100, "port": 8100, "url": "http://127.0.0.1:8100"}
    beat = httpx.post(f"{base}/api/v1/agents/heartbeat", json={"node": "n1", "generation": 0, "engines": [engine]},
                      headers=headers)
    assert beat.status_code == 200, beat.text
