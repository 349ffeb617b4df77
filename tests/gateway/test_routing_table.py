"""RoutingTableCache: keeps the last good table when the controller is down or answers garbage, and says
how old it is."""

from __future__ import annotations

import asyncio
import copy

import pytest

from fleetctl.controller import contract
from fleetctl.errors import Unavailable
from fleetctl.gateway.routing_table import (
    RoutingTableCache,
    kv_events_endpoints,
    parse_routing_table,
    refresh_delay_s,
)

TABLE = {
    "generation": 7,
    "models": {
        "smollm2-135m": {
            "traffic": {"chat@r1": 1.0, "chat@r2": 0.0},
            "pd": False,
            "classes": {
                "chat@r1": {"model": "smollm2-135m", "weights": "smollm2", "max_model_len": 2048},
                "chat@r2": {"model": "smollm2-135m", "backend": "vllm", "weights": "org/m", "data_parallel_size": 2},
            },
        }
    },
    "engines": [
        {"name": "chat-0", "node": "n1", "model": "smollm2-135m", "class_ref": "chat@r1", "role": "mixed",
         "url": "http://10.0.0.1:8100", "state": "ready", "kv_events_endpoint": "tcp://10.0.0.1:8101", "metrics": {}},
        {"name": "chat2-0", "node": "n2", "model": "smollm2-135m", "class_ref": "chat@r2", "role": "mixed",
         "url": "http://10.0.0.2:8200", "state": "ready", "kv_events_endpoint": "tcp://10.0.0.2:8201", "metrics": {}},
        {"name": "chat-1", "node": "n2", "model": "smollm2-135m", "class_ref": "chat@r1", "role": "mixed",
         "url": "http://10.0.0.2:8103", "state": "starting", "kv_events_endpoint": "tcp://10.0.0.2:8104", "metrics": {}},
    ],
    "flags": {"pd_push": True},
}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class ScriptedController:
    """Answers routing() from a script: a dict is parsed as the client parses the reply, an exception raised."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)

    async def routing(self) -> contract.RoutingTable:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return contract.RoutingTable.model_validate(copy.deepcopy(answer))


def test_parse_takes_the_whole_table():
    table = parse_routing_table(TABLE)
    assert table.generation == 7 and table.flags == {"pd_push": True}
    assert table.models["smollm2-135m"].classes["chat@r1"].max_model_len == 2048
    assert [e.name for e in table.engines_of("smollm2-135m")] == ["chat-0", "chat2-0", "chat-1"]


def test_parse_names_the_bad_field():
    bad = copy.deepcopy(TABLE)
    bad["models"]["smollm2-135m"]["classes"]["chat@r1"]["weights"] = " "
    with pytest.raises(ValueError, match=r"models.smollm2-135m.classes.chat@r1"):
        parse_routing_table(bad)
    with pytest.raises(ValueError, match="engines"):
        parse_routing_table({k: v for k, v in TABLE.items() if k != "engines"})


def test_kv_endpoints_for_ready_engines_with_replay_after_the_pub_ports():
    endpoints = kv_events_endpoints(parse_routing_table(TABLE), topic="kv-events")
    assert [(e.engine_id, e.publisher, e.replay) for e in endpoints] == [
        ("chat-0", "tcp://10.0.0.1:8101", "tcp://10.0.0.1:8102"),
        ("chat2-0", "tcp://10.0.0.2:8201", "tcp://10.0.0.2:8203"),  # vLLM, data-parallel 2
    ]


async def test_keeps_the_last_table_while_the_controller_is_down_and_reports_its_age():
    clock = Clock()
    broken = copy.deepcopy(TABLE)
    del broken["flags"]
    updates = []

    async def on_update(table):
        updates.append(table.generation)

    cache = RoutingTableCache(
        ScriptedController(TABLE, Unavailable("controller unreachable"), broken, dict(TABLE, generation=8)),
        clock=clock, on_update=on_update,
    )
    assert cache.age_s() is None and cache.table is None

    assert await cache.refresh_once()
    clock.now += 5
    assert not await cache.refresh_once()  # down
    clock.now += 5
    assert not await cache.refresh_once()  # answers a table that does not parse
    assert cache.table.generation == 7 and cache.age_s() == 10.0
    assert cache.failures == 2 and "flags" in cache.last_error

    assert await cache.refresh_once()
    assert cache.table.generation == 8 and cache.age_s() == 0.0 and cache.failures == 0
    assert updates == [7, 8]


async def test_run_backs_off_with_full_jitter_while_failing():
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) == 4:
            raise asyncio.CancelledError

    down = Unavailable("down")
    cache = RoutingTableCache(ScriptedController(TABLE, down, down, TABLE), refresh_interval_s=2.0,
                              rng=lambda: 0.5, sleep=sleep)
    with pytest.raises(asyncio.CancelledError):
        await cache.run()
    assert delays == [2.0, 2.0, 4.0, 2.0]  # 0.5 * 4, 0.5 * 8, then the interval again


def test_refresh_delay_is_capped():
    assert refresh_delay_s(2.0, 0, 30.0, 0.9) == 2.0
    assert refresh_delay_s(2.0, 50, 30.0, 0.999) == pytest.approx(29.97)
    assert refresh_delay_s(2.0, 3, 30.0, 0.0) == 0.0


def test_a_cordoned_engine_is_parsed_as_such_and_still_watched() -> None:
    body = copy.deepcopy(TABLE)
    body["engines"][0]["cordoned"] = True
    table = parse_routing_table(body)
    assert [e.cordoned for e in table.engines] == [True, False, False]  # absent: not cordoned (older controllers)
    assert table.engines[0].routable  # health, metrics and KV events are still followed
    assert "chat-0" in {e.engine_id for e in kv_events_endpoints(table)}
