"""`fleetctl engine adopt|release` against a real reference engine started outside any agent, a real controller
(SQLite) and a real gateway on its table: the engine is checked against its class, routed to, drained through
the gateway without a signal, and released; one whose settings contradict its class, and an unreachable URL,
are refused naming the field, with nothing stored."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl.client import ControllerClient
from fleetctl.errors import ValidationFailed
from gateway.procs import REPO_ROOT, Launcher, Proc, wait_until

TOKEN = "adoption-test-bootstrap-token-0123456789"


@pytest.fixture(scope="module")
def fleet(launcher: Launcher, tmp_path_factory: pytest.TempPathFactory) -> tuple[Proc, Proc, Proc]:
    engine = launcher.engine()  # no agent: nothing of fleetctl started it
    controller = launcher.controller(Path(tmp_path_factory.mktemp("controller-state")), TOKEN)
    with ControllerClient(controller.url, TOKEN) as api:
        api.apply_class("tiny", {"model": "tiny", "weights": "tiny", "max_model_len": 2048})
        api.apply_class("tiny-bf16", {"model": "tiny", "weights": "tiny", "max_model_len": 2048, "dtype": "bfloat16"})
    gateway = launcher.gateway("--controller", controller.url, "--token", TOKEN, "--table-refresh-s", "0.5",
                               "--name", "gw-adopt")
    return engine, controller, gateway


def adopted(api: ControllerClient) -> list[str]:
    return [e.name for e in api.list_engines() if e.adopted]


def test_an_adopted_engine_is_routed_to_then_drained_through_the_gateway_and_released_without_a_signal(fleet):
    engine, controller, gateway = fleet
    with ControllerClient(controller.url, TOKEN) as api:
        view = api.adopt_engine(engine.url, "tiny", "tiny@r1", reason="adoption test")
        name = f"adopted-127-0-0-1-{engine.port}"
        assert (view.name, view.node, view.state, view.adopted, view.pid) == (name, "adopted", "ready", True, None)
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 3}
        served = wait_until(lambda: (r := gateway.post("/v1/completions", body)).status_code == 200 and r, 20,
                            "the gateway to route to the adopted engine")
        assert served.headers["x-fleet-served-by"] == f"tiny@r1 {name}"

        assert api.release_engine(name, reason="adoption test").state == "draining"
        wait_until(lambda: gateway.post("/v1/completions", body).status_code == 503, 20,
                   "the gateway to stop routing to it")
        wait_until(lambda: name not in adopted(api), 60, "the released engine to leave the fleet")
    assert engine.proc.poll() is None and engine.get("/health").status_code == 200  # never signalled


def test_an_engine_whose_settings_contradict_its_class_is_refused_naming_the_field(fleet):
    engine, controller, _gateway = fleet
    with ControllerClient(controller.url, TOKEN) as api:
        with pytest.raises(ValidationFailed) as refused:
            api.adopt_engine(engine.url, "tiny", "tiny-bf16@r1")
        assert refused.value.field == "dtype" and "float32" in str(refused.value)
        with pytest.raises(ValidationFailed) as wrong_model:
            api.adopt_engine(engine.url, "not-served", "tiny@r1")
        assert wrong_model.value.field == "model"
        assert adopted(api) == []


def test_an_unreachable_url_is_refused_with_a_clear_error_and_one_cli_line(fleet):
    _engine, controller, _gateway = fleet
    with ControllerClient(controller.url, TOKEN) as api:
        with pytest.raises(ValidationFailed) as refused:
            api.adopt_engine("http://127.0.0.1:1", "tiny", "tiny@r1")
        assert refused.value.field == "url" and "cannot reach http://127.0.0.1:1" in str(refused.value)
        assert adopted(api) == []
    env = {**os.environ, "FLEET_CONTROLLER": controller.url, "FLEET_TOKEN": TOKEN}
    done = subprocess.run([sys.executable, "-m", "fleetctl.cli.main", "engine", "adopt", "http://127.0.0.1:1",
                           "--model", "tiny", "--class", "tiny@r1"], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: not adopted: cannot reach http://127.0.0.1:1: ConnectError: [Errno 111] Connection refused"]
