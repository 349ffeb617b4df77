"""The change stream's hub without HTTP (SQLite and PostgreSQL): viewers are its async generators, pulled by
the test, so "a reader that reads nothing" is a generator nobody pulls; the tick thread's life follows the
viewers (with a timer the test moves)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.controller import flags
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.watch_hub import LINGER_S, WatchHub


@pytest.fixture
def runtime(db_url: str, tmp_path: Path) -> Iterator[ControllerRuntime]:
    settings = ControllerSettings(db_url=db_url, state_dir=tmp_path / "state", background=False, watch_ping_s=60.0,
                                  watch_history_mib=0.0002)  # ~200 bytes: the ring holds the newest delta only
    runtime = ControllerRuntime(settings)
    runtime.start()
    yield runtime
    runtime.stop()


def set_flag(runtime: ControllerRuntime, name: str, value: int) -> None:
    """A change the watch sees: the per-model flag shed_fraction:`name` at value / 100."""
    with runtime.store.session() as session:
        flags.set_flag(session, f"shed_fraction:{name}", value / 100, "test", runtime.clock(), reason="test")


def event_of(frame: bytes) -> tuple[str, str]:
    """(id, event name) of the first SSE event in `frame`."""
    lines = frame.decode().split("\n")
    return lines[0].removeprefix("id: "), lines[1].removeprefix("event: ")


async def test_a_viewer_nobody_reads_blocks_no_tick_and_gets_a_snapshot_once_it_fell_behind(
        runtime: ControllerRuntime) -> None:
    hub = runtime.watch
    idle, busy = hub.stream(None), hub.stream(None)
    assert event_of(await anext(idle)) == event_of(await anext(busy)) == (f"{hub.epoch}-0", "snapshot")
    for value in range(1, 6):
        set_flag(runtime, "f", value)
        assert hub.tick() is True  # returns although `idle` has not taken a byte
        assert event_of(await anext(busy)) == (f"{hub.epoch}-{value}", "delta")
    assert hub.counters.dropped == 4 and hub.viewers == 2
    assert event_of(await anext(idle)) == (f"{hub.epoch}-5", "snapshot")  # delta 1 is gone: start over
    set_flag(runtime, "f", 6)
    hub.tick()
    assert event_of(await anext(idle)) == event_of(await anext(busy)) == (f"{hub.epoch}-6", "delta")
    await idle.aclose()
    await busy.aclose()
    assert hub.viewers == 0


async def test_a_viewer_that_falls_behind_within_the_history_catches_up_from_it(tmp_path: Path, db_url: str) -> None:
    settings = ControllerSettings(db_url=db_url, state_dir=tmp_path / "state", background=False, watch_ping_s=60.0)
    runtime = ControllerRuntime(settings)
    runtime.start()
    try:
        hub = runtime.watch
        viewer = hub.stream(None)
        await anext(viewer)
        for value in range(3):
            set_flag(runtime, "f", value)
            hub.tick()
        batch = (await anext(viewer)).decode()  # the three deltas in one write
        assert [line for line in batch.split("\n") if line.startswith("id: ")] == [
            f"id: {hub.epoch}-{seq}" for seq in (1, 2, 3)]
        assert hub.counters.snapshots_sent == 1
        await viewer.aclose()
    finally:
        runtime.stop()


class Timer:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def wait_for(condition, what: str) -> None:  # noqa: ANN001 - a predicate
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"timed out waiting for {what}")


async def test_the_tick_thread_runs_while_viewers_watch_and_stops_a_while_after_the_last_left(
        runtime: ControllerRuntime) -> None:
    timer = Timer()
    settings = runtime.settings.model_copy(update={"background": True, "watch_tick_s": 0.02})
    hub = WatchHub(settings, runtime.store, runtime.clock, lambda: True, timer)
    assert not hub.ticking
    viewer = hub.stream(None)
    await anext(viewer)
    assert hub.ticking
    ticks = hub.counters.ticks
    await wait_for(lambda: hub.counters.ticks >= ticks + 3, "ticks of the thread")
    set_flag(runtime, "seen-by-the-thread", 1)
    assert event_of(await anext(viewer))[1] == "delta"
    await viewer.aclose()
    timer.now += LINGER_S - 1
    ticks = hub.counters.ticks
    await wait_for(lambda: hub.counters.ticks >= ticks + 3, "ticks while it lingers")
    timer.now += 2
    await wait_for(lambda: not hub.ticking, "the thread to stop")
    again = hub.stream(None)
    await anext(again)
    assert hub.ticking  # a new viewer starts it again
    hub.close()
    await wait_for(lambda: not hub.ticking, "the thread to stop on close")
    with pytest.raises(StopAsyncIteration):
        await anext(again)
