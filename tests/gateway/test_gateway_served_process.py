"""Per-revision serving counters, end to end with real processes: a controller (SQLite), two tiny engines
serving class revisions tiny@r1 and tiny@r2 (plus tiny@r3 whose engine is not there) and a gateway on the
controller's table. Requests pinned to each revision (x-fleet-pin-class) are counted under it, in the
gateway's fleet_gateway_class_* metrics and in the counters the controller stores from its reports."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session

from agent.ports import free_port
from fleetctl.client import ControllerClient
from fleetctl.controller.db import make_engine
from fleetctl.controller.gateways import served_by_gateway
from fleetctl.controller.paths import sqlite_url
from fleetctl.gateway.class_choice import PIN_HEADER
from gateway.procs import Launcher, Proc, metric_value, wait_until

TOKEN = "gateway-served-test-token-0123456789"
NODE = "node-a"
GATEWAY = "gw-served"
BODY = {"model": "tiny", "prompt": "The river runs", "max_tokens": 5, "temperature": 0, "ignore_eos": True}


def observed(name: str, class_ref: str, url: str, port: int, pid: int) -> dict:
    return {"name": name, "model": "tiny", "class_ref": class_ref, "role": "mixed", "state": "ready", "pid": pid,
            "port": port, "url": url, "kv_events_endpoint": None, "restarts": 0, "last_exit": None, "metrics": {}}


@pytest.fixture(scope="module")
def fleet(launcher: Launcher, tmp_path_factory: pytest.TempPathFactory) -> tuple[Proc, Path, Proc]:
    engines = [launcher.engine(), launcher.engine()]
    state_dir = Path(tmp_path_factory.mktemp("controller-state"))
    controller = launcher.controller(state_dir, TOKEN)
    dead_port = free_port()  # tiny@r3's engine: nothing listens there
    with ControllerClient(controller.url, TOKEN) as api:
        for seqs in (64, 32, 16):  # performance-only differences: three revisions of one class
            api.apply_class("tiny", {"model": "tiny", "weights": "tiny", "max_model_len": 1024, "max_num_seqs": seqs})
        api.register_agent({"node": NODE, "url": "http://127.0.0.1:1", "labels": {},
                            "capacity": {"engines": 3, "kv_mib": 64}, "agent_version": "test"})
        reported = [observed(f"tiny-{i}", f"tiny@r{i + 1}", e.url, e.port, e.pid) for i, e in enumerate(engines)]
        reported.append(observed("tiny-2", "tiny@r3", f"http://127.0.0.1:{dead_port}", dead_port, 1))
        api.heartbeat({"node": NODE, "generation": 0, "engines": reported, "cut_off_s": None})
        api.set_traffic("tiny", {"tiny@r1": 1.0, "tiny@r2": 1.0, "tiny@r3": 0.0}, reason="served counters test")
    gateway = launcher.gateway("--controller", controller.url, "--token", TOKEN, "--table-refresh-s", "0.5",
                               "--name", GATEWAY, "--max-retries", "0")
    return controller, state_dir, gateway


def pinned(gateway: Proc, class_ref: str, stream: bool) -> int:
    """One request pinned to `class_ref`, read to its end; the status."""
    headers = {PIN_HEADER: class_ref}
    if not stream:
        return gateway.post("/v1/completions", BODY, headers=headers).status_code
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json={**BODY, "stream": True}, headers=headers,
                      timeout=60) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and "error" not in json.loads(lines[-2].removeprefix("data: ")), lines
    return response.status_code


def stored_served(state_dir: Path) -> dict:
    engine = make_engine(sqlite_url(state_dir))
    try:
        with Session(engine) as session:
            return served_by_gateway(session)  # type: ignore[return-value]
    finally:
        engine.dispose()


def test_requests_are_counted_under_the_revision_that_served_them(fleet: tuple[Proc, Path, Proc]) -> None:
    _controller, state_dir, gateway = fleet
    assert [pinned(gateway, "tiny@r1", stream) for stream in (True, True, False)] == [200, 200, 200]
    assert pinned(gateway, "tiny@r2", stream=True) == 200
    assert gateway.post("/v1/completions", BODY, headers={PIN_HEADER: "tiny@r3"}).status_code >= 500

    metrics = gateway.metrics()

    def value(name: str, ref: str) -> float:
        return metric_value(metrics, name, class_ref=ref)

    assert [value("fleet_gateway_class_requests_total", r) for r in ("tiny@r1", "tiny@r2", "tiny@r3")] == [3, 1, 1]
    assert [value("fleet_gateway_class_errors_total", r) for r in ("tiny@r1", "tiny@r2", "tiny@r3")] == [0, 0, 1]
    # streams only: two on r1, one on r2; each streamed 5 chunks, so each has an inter-token latency
    assert [value("fleet_gateway_class_ttft_seconds_count", r) for r in ("tiny@r1", "tiny@r2")] == [2, 1]
    assert [value("fleet_gateway_class_itl_seconds_count", r) for r in ("tiny@r1", "tiny@r2")] == [2, 1]

    def reported() -> dict | None:
        served = stored_served(state_dir).get(GATEWAY, {})
        return served if sum(c.requests for c in served.values()) == 5 else None

    served = wait_until(reported, 30, "the gateway to report its counters")
    r1, r2, r3 = served["tiny@r1"], served["tiny@r2"], served["tiny@r3"]  # type: ignore[index]
    assert (r1.requests, r1.errors, r1.ttft.count, r1.itl.count) == (3, 0, 2, 2)
    assert (r2.requests, r2.errors, r2.ttft.count) == (1, 0, 1)
    assert (r3.requests, r3.errors, r3.ttft.count) == (1, 1, 0)
    assert r1.ttft.sum > 0 and r1.ttft.counts[-1] <= r1.ttft.count


def test_a_break_glass_pin_sends_every_unpinned_request_to_its_revision_until_unset(
        fleet: tuple[Proc, Path, Proc]) -> None:
    controller, _state_dir, gateway = fleet

    def served(ref: str) -> float:
        return metric_value(gateway.metrics(), "fleet_gateway_class_requests_total", class_ref=ref)

    def applied(generation: int) -> None:
        with ControllerClient(controller.url, TOKEN) as api:
            wait_until(lambda: any(g.name == GATEWAY and g.generation >= generation for g in api.list_gateways()),
                       30, "the gateway to apply the change")

    with ControllerClient(controller.url, TOKEN) as api:
        applied(api.set_flag("pin:tiny", "tiny@r2", reason="r1 answers drift").generation)
    before = {ref: served(ref) for ref in ("tiny@r1", "tiny@r2")}
    assert [gateway.post("/v1/completions", BODY).status_code for _ in range(6)] == [200] * 6
    assert (served("tiny@r1") - before["tiny@r1"], served("tiny@r2") - before["tiny@r2"]) == (0, 6)
    with ControllerClient(controller.url, TOKEN) as api:
        applied(api.unset_flag("pin:tiny", reason="fixed").generation)
    before = served("tiny@r1")
    assert [gateway.post("/v1/completions", BODY).status_code for _ in range(20)] == [200] * 20
    assert served("tiny@r1") > before  # the 1:1 weights decide again (all 20 on r2: one chance in a million)
