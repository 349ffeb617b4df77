"""The wait of `fleetctl traffic set`, without a controller: which gateways have applied a generation
(pure), and the polling loop on a fake clock."""

from __future__ import annotations

import pytest

from fleetctl.cli.traffic_cmd import acknowledgements, wait_applied
from fleetctl.controller.responses import GatewayView
from fleetctl.errors import FleetError


def gw(name: str, generation: int, stale: bool = False) -> GatewayView:
    return GatewayView(name=name, url=None, generation=generation, table_age_s=0.0, refresh_interval_s=2.0,
                       first_seen="2026-01-01T00:00:00+00:00", last_seen="2026-01-01T00:00:00+00:00",
                       seen_ago_s=0.0, stale=stale, reported_by="viewer")


def test_live_gateways_at_or_past_the_generation_have_applied_it() -> None:
    acks = acknowledgements([gw("b", 7), gw("a", 9), gw("c", 6), gw("old", 1, stale=True)], 7)
    assert (acks.applied, acks.pending, acks.stale, acks.live, acks.done) == (["a", "b"], [("c", 6)], ["old"], 3, False)
    assert acknowledgements([gw("old", 1, stale=True)], 7).live == 0


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_waits_until_every_live_gateway_catches_up(capsys: pytest.CaptureFixture[str]) -> None:
    time = FakeTime()
    lists = iter([[gw("a", 6), gw("b", 6)], [gw("a", 7), gw("b", 6)], [gw("a", 7), gw("b", 8)]])
    applied = wait_applied(lambda: next(lists), 7, timeout_s=5, poll_s=0.25, clock=time.clock, sleep=time.sleep)
    assert applied == {"gateways": ["a", "b"], "stale": [], "seconds": 0.5}
    assert capsys.readouterr().err.splitlines() == [
        "waiting for generation 7: 0/2 gateway(s) applied it; waiting for a at 6, b at 6",
        "waiting for generation 7: 1/2 gateway(s) applied it; waiting for b at 6",
        "generation 7 applied by 2 gateway(s) in 0.5s: a, b",
    ]


def test_a_gateway_going_stale_is_no_longer_waited_for() -> None:
    time = FakeTime()
    lists = iter([[gw("a", 7), gw("b", 6)], [gw("a", 7), gw("b", 6, stale=True)]])
    applied = wait_applied(lambda: next(lists), 7, timeout_s=5, clock=time.clock, sleep=time.sleep)
    assert (applied["gateways"], applied["stale"]) == (["a"], ["b"])


def test_times_out_naming_the_gateways_behind() -> None:
    time = FakeTime()
    with pytest.raises(FleetError) as raised:
        wait_applied(lambda: [gw("a", 7), gw("b", 6)], 7, timeout_s=2, clock=time.clock, sleep=time.sleep)
    assert raised.value.code == "apply_timeout"
    assert str(raised.value) == "generation 7 not applied within 2s by: b (at 6); the change is stored, 1/2 gateway(s) applied it"
