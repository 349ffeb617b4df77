"""The TUI core's pure parts: number formats, the header's pieces and wrapping, the engine history's bound,
and what a batch of stream items does to the state and the connection (ui/feed.py)."""

from __future__ import annotations

from datetime import timedelta

from uicore_data import NOW, change, delta, engine, metrics_delta, small_fleet

from fleetctl.controller.watch_contract import PulseView, WatchPing
from fleetctl.watch_client import Disconnected
from fleetctl.watch_state import FleetState
from ui import format as fmt
from ui.feed import Inbox, apply_batch
from ui.history import SAMPLES, EngineHistory
from ui.widgets.header import PulseState, pack, pieces


def test_compact_numbers() -> None:
    assert [fmt.rate(v) for v in (None, 0, 0.44, 12.34, 456.0, 12345.6, 4.5e6)] == \
        ["—", "0", "0.4", "12.3", "456", "12.3k", "4.5M"]
    assert [fmt.seconds(v) for v in (None, 0.00085, 0.0423, 1.254, 12.5, 185)] == \
        ["—", "850µs", "42ms", "1.25s", "12.5s", "3m05s"]
    assert fmt.percent(0.623) == "62%" and fmt.percent(float("nan")) == "—"
    assert fmt.bar(0.62, 10) == "━━━━━━────" and fmt.bar(None, 4) == "    "
    assert fmt.age(75) == "1m15s" and fmt.age(7300) == "2h01m"


def test_header_pieces_and_none_as_a_dash() -> None:
    pulse = PulseView(at="x", frozen=None, nodes=2, nodes_up=1)
    text = " ".join(f"{p.label} {p.value}" for p in pieces(PulseState(pulse=pulse)))
    assert "req/s —" in text and "TTFT p50 — p90 —" in text and "frozen: n/a" in text and "flags: none" in text
    assert next(p for p in pieces(PulseState(pulse=pulse)) if p.label == "nodes").tone == "alert"


def test_header_says_when_the_fleet_is_frozen_or_a_model_pinned() -> None:
    pulse = PulseView(at="x", frozen=True, pins={"chat": "chat@r1"}, flags={"freeze": True, "pin:chat": "chat@r1"})
    shown = {p.label: (p.value, p.tone) for p in pieces(PulseState(pulse=pulse))}
    assert shown["frozen:"] == ("YES", "warn") and shown["PINNED"] == ("chat->chat@r1", "warn")
    assert "PINNED" not in {p.label for p in pieces(PulseState(pulse=PulseView(at="x", frozen=False)))}


def test_header_ttft_falls_back_to_the_engines_mean_without_streams() -> None:
    def ttft(**figures: float) -> str:
        return next(p.value for p in pieces(PulseState(pulse=PulseView(at="x", **figures))) if p.label == "TTFT")

    assert ttft(ttft_engines_s=0.25) == "mean 250ms (engines)"
    assert ttft(ttft_p50_s=0.12, ttft_p90_s=0.34, ttft_engines_s=0.25) == "p50 120ms p90 340ms"


def test_header_stale_piece_comes_first() -> None:
    state = PulseState(pulse=PulseView(at="x"), stale_since=NOW, error="connection refused", retry_in_s=2.0)
    first = pieces(state)[0]
    assert (first.label, first.value, first.tone) == ("STALE since", "12:00:30 (connection refused), retry in 2.0s", "stale")


def test_pack_keeps_pieces_whole() -> None:
    items = pieces(PulseState(pulse=PulseView(at="x", requests_s=3.0, flags={"a": True, "b": 2, "c": "x"})))
    for width in (80, 200):
        lines = pack(items, width)
        assert sum(len(line) for line in lines) == len(items)
        for line in lines:
            assert len("  ".join(f"{p.label} {p.value}" for p in line)) <= width
    assert len(pack(items, 80)) > len(pack(items, 200))


def test_history_is_bounded_and_forgets_engines() -> None:
    fleet, history = FleetState(), EngineHistory()
    history.record(fleet, fleet.apply(small_fleet()))
    for step in range(SAMPLES + 30):
        history.record(fleet, fleet.apply(metrics_delta("node-1/e-1", step, f"e1-{step + 2}")))
    ttft = history.series("node-1/e-1", "ttft")
    assert len(ttft) == SAMPLES
    assert abs(ttft[-1] - (0.1 + ((SAMPLES + 29) % 7) / 20)) < 1e-6  # the newest last
    assert len(history.series("node-1/e-2", "ttft")) == 1  # one sample from the snapshot
    history.record(fleet, fleet.apply(delta(change("engine", "node-1/e-1", None, op="delete"), token="e1-999")))
    assert history.series("node-1/e-1", "ttft") == [] and len(history) == 5


def test_a_batch_applies_in_order_and_reports_the_connection() -> None:
    fleet = FleetState()
    gone = Disconnected(error="connection refused", at=NOW, retry_in_s=1.5)
    batch = apply_batch(fleet, [small_fleet(), gone], None)
    assert batch.applied is not None and batch.applied.reset
    assert batch.stale_since == NOW and batch.connection is not None and not batch.connection.connected
    later = Disconnected(error="still refused", at=NOW + timedelta(seconds=2), retry_in_s=3.0)
    batch = apply_batch(fleet, [later], batch.stale_since)
    assert batch.stale_since == NOW  # stale since the first disconnect
    assert batch.connection is not None and batch.connection.error == "still refused"
    batch = apply_batch(fleet, [WatchPing(token="e1-1", at="x")], batch.stale_since)
    assert batch.stale_since is None and batch.connection is not None and batch.connection.connected
    assert batch.applied is None  # a ping changes nothing


def test_a_burst_merges_into_one_applied() -> None:
    fleet = FleetState()
    apply_batch(fleet, [small_fleet()], None)
    burst = [metrics_delta("node-1/e-1", 1, "e1-2"), metrics_delta("node-1/e-2", 2, "e1-3")]
    batch = apply_batch(fleet, burst, None)
    assert batch.applied is not None and not batch.applied.reset
    assert batch.applied.changed == {("engine", "node-1/e-1"), ("engine", "node-1/e-2")}
    assert batch.connection is None


def test_inbox_wakes_only_when_it_was_empty() -> None:
    inbox = Inbox()
    assert inbox.put(1) and not inbox.put(2)
    assert inbox.take() == [1, 2] and len(inbox) == 0
    assert inbox.put(3)


def test_a_burst_stays_patched_only_where_every_message_patched() -> None:
    fleet = FleetState()
    apply_batch(fleet, [small_fleet()], None)
    put = delta(change("engine", "node-1/e-2", engine("node-1", "e-2"), op="put"), token="e1-4")
    batch = apply_batch(fleet, [metrics_delta("node-1/e-1", 1, "e1-2"), metrics_delta("node-1/e-2", 2, "e1-3"), put],
                        None)
    assert batch.applied is not None
    assert batch.applied.patched == {("engine", "node-1/e-1"): {"metrics", "rates"}}

