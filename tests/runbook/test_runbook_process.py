"""The node maintenance runbook runs for real under load without dropping a request: a controller, two
agents running tiny reference engines (two replicas of one deployment), a gateway, steady chat requests
through it from two threads, and `fleetctl runbook run node-maintenance --yes` as an operator runs it
(each step a `fleetctl` subprocess). Every request is answered 200 and complete; the node ends uncordoned
with its engines moved away; the audit log holds the run's start, every step and its finish."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rollout_proc.rollout_fleet import FleetOptions, RolloutFleet, start_fleet, stop_fleet
from tests.rollout_proc.rollout_load import Load, describe

pytestmark = pytest.mark.slow


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[RolloutFleet]:
    started = start_fleet(tmp_path / "fleet", FleetOptions(nodes=2, replicas=2))
    try:
        yield started
    finally:
        stop_fleet(started)


def test_node_maintenance_under_load_drops_no_request(fleet: RolloutFleet) -> None:
    node = sorted(e["node"] for e in fleet.engines() if e["state"] == "ready")[0]
    with Load(fleet.gateway_url, workers=2) as load:
        load.wait_for(5)
        done = fleet.cli("runbook", "run", "node-maintenance", "--yes", "-o", "json", "--var", f"node={node}",
                         "--var", "upgraded=yes", "--var", "drain_timeout=120", timeout_s=170)
        load.wait_for(len(load.snapshot()) + 5)  # and serving goes on after the run
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["outcome"] == "completed" and {s["outcome"] for s in result["steps"]} == {"ok"}
    assert load.failures() == [], describe(load.snapshot())
    with fleet.client() as api:
        shown = api.get_node(node)
        assert (shown.cordoned, shown.draining) == (False, False)
        assert not [e for e in api.list_engines(node=node) if not e.drain and e.state == "ready"]
        events = [e for e in api.list_audit(limit=500) if e.action.startswith("runbook.")]
        node_events = {e.action for e in api.list_audit(limit=500) if e.target == node}
    steps = len(result["steps"])
    assert [e.action for e in events] == ["runbook.start", *["runbook.step"] * steps, "runbook.finish"]
    assert events[-1].code == "completed" and {e.detail["run_id"] for e in events} == {result["run_id"]}
    assert {"node.cordon", "node.drain", "node.uncordon"} <= node_events  # the steps' own changes, audited too
