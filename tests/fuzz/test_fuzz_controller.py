"""The controller's API under schema-driven fuzzing, on SQLite and PostgreSQL: every operation of its OpenAPI
schema, valid and invalid requests, with an admin token (so requests get past authentication to the
handlers). No answer is a 5xx, every status is one the schema declares, and afterwards the controller still
answers `status` and takes a change."""

from __future__ import annotations

from pathlib import Path

import httpx
from fuzzing import fuzz

from fleetctl.controller.server import ServerThread
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import role_tokens

BUDGET_S = 40.0
EXAMPLES = 25  # per operation and mode


def test_the_controller_api_survives_fuzzing(db_url: str, tmp_path: Path) -> None:
    settings = ControllerSettings(db_url=db_url, state_dir=tmp_path / "state", port=0, reconcile_interval_s=0.5)
    with ServerThread(settings) as server:
        admin = {"Authorization": f"Bearer {role_tokens(server.runtime.store)['admin']}"}
        schema = httpx.get(f"{server.url}/openapi.json").json()
        # /api/v1/tokens/{name} would revoke the fuzzer's own token; /api/v1/watch is a stream that never ends
        report = fuzz("controller", server.url, schema, admin, BUDGET_S, EXAMPLES,
                      skip=lambda method, path: path in ("/api/v1/tokens/{name}", "/api/v1/watch"))
        print(report.summary())
        assert report.server_errors == []
        assert report.undeclared == []
        assert report.cases >= 200 and len(report.statuses) >= 30
        assert {200, 422} <= set(report.totals())  # it reached handlers and their validation
        with httpx.Client(base_url=server.url, headers=admin) as api:
            assert api.get("/api/v1/status").status_code == 200
            assert api.put("/api/v1/flags/prefix_routing", json={"value": True, "reason": "after the fuzz"}).status_code == 200
