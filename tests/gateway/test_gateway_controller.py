"""The gateway on a real controller's routing table (`fleetctl controller serve`, SQLite): it routes by the
table's classes and engines, and when the controller goes away it keeps routing on its last table and says
how old that table is."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.client import ControllerClient
from gateway.procs import Launcher, Proc, metric_value, wait_until

TOKEN = "gateway-test-bootstrap-token-0123456789"
NODE = "node-a"


def report_engine(api: ControllerClient, engine: Proc) -> None:
    """What an agent would do: register its node and report one ready engine serving class tiny@r1."""
    api.register_agent({"node": NODE, "url": "http://127.0.0.1:1", "labels": {},
                        "capacity": {"engines": 1, "kv_mib": 64}, "agent_version": "test"})
    observed = {"name": "tiny-0", "model": "tiny", "class_ref": "tiny@r1", "role": "mixed", "state": "ready",
                "pid": engine.pid, "port": engine.port, "url": engine.url, "kv_events_endpoint": None, "restarts": 0,
                "last_exit": None, "metrics": {}}
    api.heartbeat({"node": NODE, "generation": 0, "engines": [observed], "cut_off_s": None})


@pytest.fixture(scope="module")
def fleet(launcher: Launcher, tmp_path_factory: pytest.TempPathFactory) -> tuple[Proc, Proc]:
    engine = launcher.engine()
    controller = launcher.controller(Path(tmp_path_factory.mktemp("controller-state")), TOKEN)
    with ControllerClient(controller.url, TOKEN) as api:
        assert api.apply_class("tiny", {"model": "tiny", "weights": "tiny", "max_model_len": 1024}).ref == "tiny@r1"
        report_engine(api, engine)
        api.set_traffic("tiny", {"tiny@r1": 1.0}, reason="gateway test")
    return controller, engine


def test_routes_on_the_controller_table_and_keeps_routing_when_it_is_gone(launcher: Launcher, fleet: tuple[Proc, Proc]) -> None:
    controller, engine = fleet
    gateway = launcher.gateway("--controller", controller.url, "--token", TOKEN, "--table-refresh-s", "0.5",
                               "--name", "gw-test")
    with ControllerClient(controller.url, TOKEN) as api:
        generation = api.routing().generation
        reported = wait_until(lambda: [g for g in api.list_gateways() if g.name == "gw-test"], 20,
                              "the gateway to report the generation it applied")
    assert reported[0].generation == generation and reported[0].url == gateway.url
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 3}
    response = gateway.post("/v1/completions", body)
    assert response.status_code == 200, response.text
    assert response.headers["x-fleet-served-by"] == "tiny@r1 tiny-0"
    # the class's context window (1024, from the controller) is the one enforced, not the engine's 2048
    too_long = gateway.post("/v1/completions", {**body, "max_tokens": 1100})
    assert too_long.status_code == 400 and "context window of 1024" in too_long.json()["error"]["message"]

    age_before = metric_value(gateway.metrics(), "fleet_gateway_table_age_seconds")
    assert 0 <= age_before < 5
    controller.kill()
    wait_until(lambda: metric_value(gateway.metrics(), "fleet_gateway_table_refresh_failures") >= 2, 30,
               "refreshes to fail")
    response = gateway.post("/v1/completions", body)
    assert response.status_code == 200 and response.headers["x-fleet-served-by"] == "tiny@r1 tiny-0"
    ages = [metric_value(gateway.metrics(), "fleet_gateway_table_age_seconds")]
    ages.append(wait_until(lambda: (a := metric_value(gateway.metrics(), "fleet_gateway_table_age_seconds")) > ages[0] + 1 and a,
                           30, "the table age to grow"))
    health = gateway.get("/health").json()
    assert health["status"] == "ok" and health["table_age_s"] > 1 and "Unavailable" in health["table_error"]
