"""`fleetctl status` with gateways, `fleetctl gateway list`, and `fleetctl status --watch`: end to end against
a real controller (a snapshot drawn, `--max-updates`, `-o json`), and its redraw rules over a scripted
stream with an injected clock (coalescing, the stale line on stderr, resuming drawing)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from cli_helpers import Fleet, ok

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.output import Format
from fleetctl.cli.status_watch import watch_status
from fleetctl.controller.watch_contract import WatchDelta, WatchPing, WatchSnapshot
from fleetctl.watch_client import Disconnected

REGISTRATION = {"node": "n1", "url": "http://n1:9000", "labels": {}, "capacity": {"engines": 2, "kv_mib": 64},
                "agent_version": "test"}


def report_gateway(fleet: Fleet, name: str = "gw-1") -> None:
    with fleet.client("viewer") as client:
        generation = client.routing().generation
        client.report_gateway({"name": name, "url": f"http://{name}:8000", "generation": generation,
                               "table_age_s": 1.5, "refresh_interval_s": 3600})


def test_status_lists_the_gateways(fleet: Fleet) -> None:
    report_gateway(fleet)
    shown = ok(fleet.run("status")).stdout
    assert "GATEWAY" in shown and "gw-1" in shown and "live" in shown and "1.5s" in shown
    data = json.loads(ok(fleet.run("status", "-o", "json")).stdout)
    assert [(g["name"], g["stale"]) for g in data["gateways"]] == [("gw-1", False)]


def test_gateway_list_shows_url_table_age_generation_and_health(fleet: Fleet) -> None:
    assert "GATEWAY" in ok(fleet.run("gateway", "list")).stdout  # none yet: the header only
    report_gateway(fleet, "gw-a")
    lines = ok(fleet.run("gateway", "list")).stdout.splitlines()
    assert lines[0].split() == ["GATEWAY", "URL", "TABLE", "AGE", "GENERATION", "HEALTH", "SEEN"]
    assert lines[1].split()[:3] == ["gw-a", "http://gw-a:8000", "1.5s"] and "live" in lines[1]
    (gateway,) = json.loads(ok(fleet.run("gateway", "list", "-o", "json")).stdout)
    assert (gateway["url"], gateway["table_age_s"]) == ("http://gw-a:8000", 1.5)


def test_status_watch_draws_the_fleet_from_the_stream_and_stops_after_max_updates(fleet: Fleet) -> None:
    with fleet.client("agent") as agent:
        agent.register_agent(REGISTRATION)
    report_gateway(fleet)
    drawn = ok(fleet.run("status", "--watch", "--max-updates", "1", role="viewer")).stdout
    assert drawn.startswith(f"controller: 127.0.0.1:{fleet.server.settings.port}")
    assert "pulse: " in drawn and "n1" in drawn and "gw-1" in drawn and "ENGINES: none" in drawn
    line = ok(fleet.run("status", "--watch", "--max-updates", "1", "-o", "json", role="viewer")).stdout
    view = json.loads(line)
    assert [n["name"] for n in view["nodes"]] == ["n1"] and view["pulse"]["nodes_up"] == 1
    assert view["token"].rsplit("-", 1)[1].isdigit()  # EPOCH-SEQ: what a later watch can resume from


def test_max_updates_only_goes_with_watch(fleet: Fleet) -> None:
    result = fleet.run("status", "--max-updates", "2")
    assert result.exit_code == ExitCode.USAGE and "--max-updates: only with --watch" in result.stderr


NODE = {"name": "n1", "url": "http://n1:9000", "state": "up", "cordoned": False, "draining": False, "labels": {},
        "capacity": {"engines": 2, "kv_mib": 64}, "agent_version": "t", "engines": 0,
        "last_heartbeat_at": "2026-01-01T00:00:00+00:00", "heartbeat_age_s": 0.0, "generation": 0,
        "applied_generation": 0, "cut_off_s": None, "registered_at": "2026-01-01T00:00:00+00:00"}
AT = "2026-01-01T00:00:{:02d}+00:00"


class Ticks:
    """A clock the scripted stream moves: each item carries the time it arrives at."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def scripted(ticks: Ticks, items: list[tuple[float, object]]):  # noqa: ANN201 - a generator
    for when, item in items:
        ticks.now = when
        yield item


def test_watch_redraws_at_most_once_a_second_and_says_when_it_went_stale(capsys: pytest.CaptureFixture[str]) -> None:
    down = datetime(2026, 1, 1, 0, 0, 5, tzinfo=timezone.utc)
    items = [
        (0.0, WatchSnapshot(token="e-0", at=AT.format(0), ping_s=2.0, resources={"node": {"n1": NODE}})),
        (0.5, WatchDelta(token="e-1", at=AT.format(1), changes=[{"kind": "node", "key": "n1", "op": "patch",
                                                                  "value": {"cordoned": True}}])),
        (0.9, WatchPing(token="e-1", at=AT.format(1))),  # still within the second: nothing drawn
        (1.2, WatchPing(token="e-1", at=AT.format(2))),  # the pending change is drawn now
        (3.0, WatchPing(token="e-1", at=AT.format(3))),  # nothing pending: nothing drawn
        (5.0, Disconnected("controller at http://x unreachable (ConnectError)", down, 0.5)),
        (6.0, Disconnected("controller at http://x unreachable (ConnectError)", down.replace(second=6), 1.25)),
        (9.0, WatchDelta(token="e-2", at=AT.format(9), changes=[{"kind": "node", "key": "n1", "op": "patch",
                                                                  "value": {"state": "down"}}])),
        (9.1, WatchPing(token="e-2", at=AT.format(9))),  # never reached: max_updates
    ]
    ticks = Ticks()
    code = watch_status(None, Format.json, 3, source=scripted(ticks, items), clock=ticks)  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    views = [json.loads(line) for line in out.splitlines()]
    assert code == ExitCode.OK and len(views) == 3
    assert [(v["token"], v["nodes"][0]["cordoned"], v["nodes"][0]["state"]) for v in views] == [
        ("e-0", False, "up"), ("e-1", True, "up"), ("e-2", True, "down")]
    assert views[2]["nodes"][0]["heartbeat_age_s"] == 9.0  # the age as of the last message
    local = down.astimezone().strftime("%H:%M:%S")
    assert err.splitlines() == [
        f"stale since {local}: controller at http://x unreachable (ConnectError); retrying in 0.5s",
        f"stale since {local}: controller at http://x unreachable (ConnectError); retrying in 1.2s",
    ]


def test_watch_tables_are_drawn_over_each_other_on_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    ticks = Ticks()
    items = [(0.0, WatchSnapshot(token="e-0", at=AT.format(0), ping_s=2.0, resources={"node": {"n1": NODE}}))]
    assert watch_status(None, Format.table, 1, source=scripted(ticks, items), clock=ticks,  # type: ignore[arg-type]
                        terminal=True) == ExitCode.OK
    out = capsys.readouterr().out
    assert out.startswith("\x1b[H\x1b[2Jcontroller: ?") and "n1" in out and "GATEWAYS: none" in out


def test_the_pulse_line_shows_the_engines_mean_ttft_when_no_gateway_saw_a_stream() -> None:
    from fleetctl.cli.status_watch import pulse_line

    assert "TTFT mean 250ms (engines)" in pulse_line({"ttft_engines_s": 0.25})
    assert "TTFT p50 120ms p90 340ms" in pulse_line({"ttft_p50_s": 0.12, "ttft_p90_s": 0.34, "ttft_engines_s": 0.25})
