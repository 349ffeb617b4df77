"""`fleetctl canary status|show|events` against a real controller on loopback, whose verdict reconciler
runs in the background over canary_probes rows stored as the probe executor stores them: the table shows
'not measured' for a stream without enough probes (never healthy), the drifting stream's statistic against
its threshold; JSON for scripts; an unknown class is one error line and a non-zero exit."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from cli_helpers import Fleet, ok, one_error_line

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.client import ControllerClient
from tests.controller.canary_store_helpers import MODEL, add_probes, store_reference
from tests.controller.ctl_helpers import SPEC, Clock

R1 = "chat@r1"


@pytest.fixture
def probed(fleet: Fleet) -> Fleet:
    """chat@r1 deployed; its batch-1 stream drifting (16 probes, 6 bad), its batch-4 stream not measured."""
    with fleet.client("operator") as api:
        api.apply_class("chat", SPEC)
        api.set_deployment("chat", R1, 1)
    clock = Clock()
    clock.now = datetime.now(timezone.utc)  # the server runs on the real clock (and prunes probes a week old)
    store = SimpleNamespace(runtime=fleet.server.runtime, clock=clock)
    ref = store_reference(store, R1)  # type: ignore[arg-type]
    add_probes(store, ref, R1, 10)  # type: ignore[arg-type]
    add_probes(store, ref, R1, 6, diverged=True)  # type: ignore[arg-type]
    add_probes(store, ref, R1, 3, condition=4)  # type: ignore[arg-type]
    # The three batches above are three commits, so the verdict reconciler may judge them in separate passes:
    # wait for the state the tests read (both streams stored, b1 drifting), not for a count of events, which
    # b1 alone reaches (not measured -> healthy -> drifting) before the b4 probes are judged.
    deadline = time.monotonic() + 90  # slow on a loaded machine
    with fleet.client("viewer") as api:
        while not _judged(api) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _judged(api), "the verdict reconciler did not judge both streams within 90 s"
    return fleet


def _judged(api: ControllerClient) -> bool:
    verdicts = {s.batch: s.verdict for s in api.canary_status(model=MODEL)}
    return verdicts.get("b1") == "drifting" and "b4" in verdicts


def test_status_table_shows_drifting_and_not_measured(probed: Fleet) -> None:
    lines = ok(probed.run("canary", "status", MODEL)).stdout.splitlines()
    assert lines[0].split() == ["MODEL", "CLASS", "BATCH", "VERDICT", "SINCE", "PROBES", "BAD", "STAT/H", "FIRST-DIV",
                                "BLAMED"]
    b1, b4 = lines[1], lines[2]
    assert "b1" in b1 and "drifting" in b1 and "5.33/5.00" in b1 and " 16 " in b1 and " 6 " in b1
    assert "b4" in b4 and "not measured" in b4 and "healthy" not in b4


def test_status_json_show_and_events(probed: Fleet) -> None:
    streams = json.loads(ok(probed.run("canary", "status", "-o", "json")).stdout)
    assert [(s["batch"], s["verdict"]) for s in streams] == [("b1", "drifting"), ("b4", "not_measured")]
    shown = ok(probed.run("canary", "show", "chat", "--limit", "4")).stdout
    assert shown.startswith("class chat@r1") and shown.count("diverged") == 1 and "RESULT" in shown
    as_json = json.loads(ok(probed.run("canary", "show", R1, "-o", "json")).stdout)
    assert len(as_json["probes"]) == 19 and as_json["streams"][0]["verdict"] == "drifting"
    events = ok(probed.run("canary", "events", MODEL)).stdout
    assert "not measured" in events and "healthy -> drifting" in events


def test_an_unknown_class_is_one_error_line(probed: Fleet) -> None:
    result = probed.run("canary", "show", "nope@r3")
    assert result.exit_code == ExitCode.NOT_FOUND, result.output
    assert "nope@r3" in one_error_line(result)


def test_probes_off_and_on_flip_the_kill_switch(fleet: Fleet) -> None:
    off = ok(fleet.run("canary", "probes", "off", "--reason", "test"))
    assert "canary probes off" in off.stderr
    with fleet.client("viewer") as api:
        assert api.list_flags()["canary_probes"].value is False
    assert "(already)" in ok(fleet.run("canary", "probes", "off", "--reason", "test")).stderr
    without = fleet.run("canary", "probes", "on")  # a kill switch needs a reason
    assert without.exit_code == ExitCode.USAGE and "reason" in one_error_line(without)
    ok(fleet.run("canary", "probes", "on", "--reason", "test"))
    with fleet.client("viewer") as api:
        assert api.list_flags()["canary_probes"].value is True
    refused = fleet.run("canary", "probes", "maybe")
    assert refused.exit_code != 0
