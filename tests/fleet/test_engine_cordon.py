"""An engine cordon end to end, on real controller, agent, gateway and tiny engine processes: once every
gateway applied the cordon's routing generation, no user request reaches the cordoned engine, which keeps
running (and still answers a canary probe that names it); uncordoned, it takes requests again."""

from __future__ import annotations

import httpx
import pytest
from fleet_helpers import controller, converged, engines_by_name, wait_until

from engine.contract.faults import PIN_ENGINE_HEADER, PROBE_HEADER

pytestmark = pytest.mark.slow

REQUESTS = 12


def served_by(gateway_url: str, prompt: str, headers: dict[str, str] | None = None) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    response = httpx.post(f"{gateway_url}/v1/completions", json=body, headers=headers or {}, timeout=60)
    assert response.status_code == 200, response.text
    return response.headers["x-fleet-served-by"].split(" ", 1)[1]


def applied(api, generation: int) -> bool:
    gateways = [g for g in api.list_gateways() if not g.stale]
    return bool(gateways) and all(g.generation >= generation for g in gateways)


def test_a_cordoned_engine_gets_no_user_request_but_keeps_running(tiny_fleet) -> None:
    wait_until(lambda: converged(tiny_fleet, replicas=2), 60, "2 ready engines")
    gateway = tiny_fleet.gateway_url
    assert gateway is not None
    with controller(tiny_fleet) as api:
        result = api.cordon_engine("local-0", reason="test: suspect engine")
        assert result.result == "changed" and result.generation is not None
        wait_until(lambda: applied(api, result.generation), 30, "the gateway to apply the cordon")
        served = {served_by(gateway, f"request {i} about rivers") for i in range(REQUESTS)}
        assert served == {"local-1"}
        assert engines_by_name(tiny_fleet)["local-0"]["state"] == "ready"  # still running
        probe = {PROBE_HEADER: "pinned", PIN_ENGINE_HEADER: "local-0"}
        assert served_by(gateway, "a probe", probe) == "local-0"

        back = api.uncordon_engine("local-0", reason="test: cleared")
        wait_until(lambda: applied(api, back.generation), 30, "the gateway to apply the uncordon")
        served = {served_by(gateway, f"later request {i} about stones") for i in range(REQUESTS)}
        assert "local-0" in served
