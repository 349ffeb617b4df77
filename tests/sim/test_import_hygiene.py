"""The simulator is torch-free and HTTP-free: it imports the gateway's admission functions and no service."""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN = ("torch", "transformers", "httpx", "fastapi", "starlette", "sqlalchemy", "typer", "textual", "zmq")


def test_importing_the_simulator_loads_no_engine_service_or_controller_code():
    code = "import json, sys, fleetctl.sim; print(json.dumps(sorted(sys.modules)))"
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                           text=True).stdout))
    assert not {m for m in loaded if m.split(".")[0] in FORBIDDEN}
    assert {m for m in loaded if m.startswith("fleetctl.")} - {m for m in loaded if m.startswith("fleetctl.sim")} == {
        "fleetctl.gateway", "fleetctl.gateway.admission"}
