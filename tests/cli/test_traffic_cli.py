"""`fleetctl traffic get|set` end to end against a real controller on loopback. A minimal agent loop
(real heartbeats) keeps the engines ready; gateways are the real routing-table cache and reporter
(traffic_helpers.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import yaml
from cli_helpers import Fleet, ok, one_error_line
from traffic_helpers import MODEL, SPEC, gateway, serving, wait_listed
from typer.testing import CliRunner

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.main import app
from fleetctl.controller.server import free_port


@pytest.fixture
def served(fleet: Fleet) -> Iterator[Fleet]:
    with ExitStack() as stack:
        serving(fleet, stack)
        yield fleet


BAD_ARGS = [
    ([], "give at least one weight: expected NAME@rN=WEIGHT"),
    (["chat@r1"], "'chat@r1': expected NAME@rN=WEIGHT"),
    (["chat@r1="], "'chat@r1=': expected NAME@rN=WEIGHT"),
    (["chat=1"], "'chat=1': class reference 'chat' is not of the form NAME@rN"),
    (["chat@r1=lots"], "'chat@r1=lots': weight 'lots' is not a number"),
    (["chat@r1=-1"], "'chat@r1=-1': weight must be a finite number >= 0"),
    (["chat@r1=inf"], "'chat@r1=inf': weight must be a finite number >= 0"),
    (["chat@r1=1", "chat@r1=2"], "chat@r1 is given twice"),
]


@pytest.mark.parametrize(("args", "says"), BAD_ARGS)
def test_bad_weights_are_usage_errors_on_one_line(args: list[str], says: str) -> None:
    controller = f"http://127.0.0.1:{free_port()}"  # never reached: parsing comes first
    result = CliRunner().invoke(app, ["--controller", controller, "--token", "t", "traffic", "set", MODEL, *args])
    assert result.exit_code == ExitCode.USAGE
    assert says in one_error_line(result)


def test_get_shows_weights_ready_engines_and_correctness_fields(served: Fleet) -> None:
    table = ok(served.run("traffic", "get", MODEL, role="viewer"))
    assert "no policy: every deployed revision equally" in table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["REVISION", "WEIGHT", "SHARE", "READY", "CORRECTNESS"]
    assert lines[1].split()[:4] == ["chat@r1", "1", "50%", "1"] and "len=2048" in lines[1]
    assert "len=8192" in lines[2] and "sampler=exact" in lines[2] and "dtype=float32" in lines[2]
    view = json.loads(ok(served.run("traffic", "get", MODEL, "-o", "json")).stdout)
    assert view["source"] == "deployments" and view["revisions"][1]["correctness"]["max_model_len"] == 8192
    missing = served.run("traffic", "get", "no-such-model")
    assert missing.exit_code == ExitCode.NOT_FOUND and "no traffic policy" in one_error_line(missing)


def test_a_refused_split_exits_5_with_one_line_and_stores_nothing(served: Fleet) -> None:
    result = served.run("traffic", "set", MODEL, "chat@r1=90", "chat@r2=10", "--reason", "try it", role="operator")
    assert result.exit_code == ExitCode.REFUSED
    assert one_error_line(result) == (
        "error: chat@r1 and chat@r2 differ in correctness fields: max_model_len 2048 -> 8192; "
        "pass allow_correctness_change to split traffic anyway")
    with served.client() as client:
        assert client.get_traffic(MODEL).source == "deployments"
        (event,) = [e for e in client.list_audit() if e.action == "traffic.set"]
        assert (event.result, event.code, event.reason) == ("refused", "correctness_split_refused", "try it")


def test_no_ready_engine_is_a_refusal_too(fleet: Fleet) -> None:
    with fleet.client() as client:
        client.apply_class("chat", SPEC)
    result = fleet.run("traffic", "set", MODEL, "chat@r1=1")
    assert result.exit_code == ExitCode.REFUSED and "no ready engine serves chat@r1" in one_error_line(result)


def test_allowing_a_correctness_change_asks_first_and_is_audited(served: Fleet) -> None:
    aborted = served.run("traffic", "set", MODEL, "chat@r1=90", "chat@r2=10", "--allow-correctness-change", input="n\n")
    assert aborted.exit_code == ExitCode.ERROR
    assert "Allow a correctness change for smollm2-135m (chat@r1=90 chat@r2=10)?" in aborted.stdout
    assert "chat@r1 and chat@r2 differ in correctness fields: max_model_len 2048 -> 8192" in aborted.stdout
    with served.client() as client:
        assert client.get_traffic(MODEL).source == "deployments"
    done = ok(served.run("traffic", "set", MODEL, "chat@r1=90", "chat@r2=10", "--allow-correctness-change", "--no-wait",
                         "-o", "yaml", input="y\n"))
    assert "correctness change allowed (audited): chat@r1 and chat@r2 differ in max_model_len 2048 -> 8192" in done.stderr
    assert yaml.safe_load(done.stdout.split("[y/N]: y\n", 1)[1])["weights"] == {"chat@r1": 90.0, "chat@r2": 10.0}
    with served.client() as client:
        (event,) = [e for e in client.list_audit() if e.action == "traffic.set"][-1:]
        assert (event.result, event.code) == ("ok", "correctness_change_allowed")
        assert event.detail["correctness_differences"][0]["fields"][0]["field"] == "max_model_len"


def test_set_waits_until_every_live_gateway_applied_the_change(served: Fleet) -> None:
    with served.client("viewer") as client:  # a gateway that reported once and went away
        client.report_gateway({"name": "gw-gone", "generation": 1, "table_age_s": 0.0, "refresh_interval_s": 0.05})
    with gateway(served, "gw-a"), gateway(served, "gw-b"):
        wait_listed(served, {"gw-a", "gw-b"})
        result = ok(served.run("traffic", "set", MODEL, "chat@r1=90", "chat@r2=10", "--allow-correctness-change", "--yes",
                               "-o", "json", "--reason", "canary"))
        output = json.loads(result.stdout)
        with served.client() as client:
            reported = {g.name: g.generation for g in client.list_gateways()}
    generation = output["generation"]
    assert output["applied"]["gateways"] == ["gw-a", "gw-b"] and output["applied"]["stale"] == ["gw-gone"]
    assert reported["gw-a"] >= generation and reported["gw-b"] >= generation
    assert f"traffic {MODEL}: changed (routing generation {generation})" in result.stderr
    assert f"generation {generation} applied by 2 gateway(s) in " in result.stderr
    assert result.stderr.rstrip().endswith("gw-a, gw-b; not waited for (stale): gw-gone")


def test_set_says_so_when_no_gateway_is_registered(served: Fleet) -> None:
    result = ok(served.run("traffic", "set", MODEL, "chat@r1=1"))
    assert "no gateways registered; nothing to wait for" in result.stderr
    assert "chat@r1" in result.stdout


def test_a_gateway_that_does_not_apply_the_change_times_the_wait_out(served: Fleet) -> None:
    with gateway(served, "gw-a"), gateway(served, "gw-stuck", stuck_at=0):
        wait_listed(served, {"gw-a", "gw-stuck"})
        result = served.run("traffic", "set", MODEL, "chat@r2=1", "--timeout", "1")
    assert result.exit_code == ExitCode.ERROR
    assert "waiting for generation" in result.stderr and "waiting for gw-stuck at 0" in result.stderr
    line = one_error_line(result, after_progress=True)
    assert "not applied within 1s by: gw-stuck (at 0); the change is stored, 1/2 gateway(s) applied it" in line
    with served.client() as client:
        assert client.get_traffic(MODEL).weights == {"chat@r2": 1.0}
