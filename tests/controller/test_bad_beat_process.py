"""The reported reproduction, against a real `fleetctl controller serve` process (SQLite and PostgreSQL): a
heartbeat carrying a PID no process can have is refused with a 422 naming the field, and the control plane
keeps answering every call, reads and writes, and keeps taking good beats."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.ports import free_port
from fleetctl.controller.testing import wait_healthy

TOKEN = "bad-beat-test-bootstrap-token-0123456789"
REPO = Path(__file__).resolve().parents[2]
EVIL_ENGINE = {"name": "e0", "model": "m", "class_ref": "m@r1", "role": "mixed", "state": "ready",
               "pid": 100000000000000000000000, "port": 1, "url": None, "kv_events_endpoint": None, "restarts": 0}


@pytest.fixture
def controller(db_url: str, tmp_path: Path) -> Iterator[str]:
    """`fleetctl controller serve` on `db_url` (conftest: SQLite and PostgreSQL)."""
    yield from _serve(tmp_path, db_url)


def _serve(tmp_path: Path, db_url: str) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "FLEET_BOOTSTRAP_TOKEN": TOKEN, "FLEET_DB_URL": db_url}
    argv = [sys.executable, "-m", "fleetctl.cli.main", "controller", "serve", "--state-dir", str(tmp_path / "state"),
            "--port", str(port), "--log-level", "warning"]
    with open(tmp_path / "controller.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_an_out_of_range_pid_is_refused_and_the_api_keeps_answering(controller: str) -> None:
    with httpx.Client(base_url=controller, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as api:
        node = {"node": "evil", "url": "http://127.0.0.1:9", "capacity": {"engines": 1, "kv_mib": 16}, "labels": {},
                "agent_version": "x"}
        assert api.post("/api/v1/agents/register", json=node).status_code == 200
        bad = api.post("/api/v1/agents/heartbeat", json={"node": "evil", "generation": 0, "engines": [EVIL_ENGINE]})
        assert bad.status_code == 422, bad.text
        assert bad.json()["error"]["field"] == "engines.0.pid"
        good = api.post("/api/v1/agents/heartbeat", json={"node": "evil", "generation": 0,
                                                          "engines": [{**EVIL_ENGINE, "pid": 4242}]})
        assert good.status_code == 200
        for _ in range(5):  # the write-behind flush runs every 0.25 s: several of them pass here
            assert api.get("/api/v1/status").status_code == 200
            time.sleep(0.3)
        assert api.get("/api/v1/nodes").json()[0]["name"] == "evil"
        assert [e["pid"] for e in api.get("/api/v1/engines").json()] == [4242]
        assert api.put("/api/v1/flags/shed_fraction:after", json={"value": 0.1, "reason": "test"}).status_code == 200
