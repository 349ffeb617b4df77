"""The routing simulator: engines as independent prefill servers with prefix caches, and the three policies."""

from __future__ import annotations

from dataclasses import replace

from fleetctl.gateway.prefix_warming import WarmPolicy
from fleetctl.sim.routing import (RoutingSimConfig, SimEngine, SimRequest, cache_aware_router, gateway_router,
                                  make_router, prefill_warm, requests_from_rows, round_robin_router, simulate,
                                  summarise)

CONFIG = RoutingSimConfig(engines=4, prefill_tokens_per_s=1600.0, decode_step_s=0.01, decode_slowdown=0.0)
SHARED = tuple(range(10))  # a 10-block prefix


def req(at: float, blocks: tuple[int, ...], out: int = 4) -> SimRequest:
    return SimRequest(at, blocks, out)


def test_a_prompt_reuses_the_leading_blocks_its_engine_holds_and_waits_its_turn():
    outcomes = simulate([req(0.0, SHARED), req(0.0, SHARED + (99,))], lambda r, t, e: 0, CONFIG)
    first, second = outcomes
    assert first.cached_tokens == 0 and abs(first.ttft_s - 160 / 1600) < 1e-9
    assert second.cached_tokens == 160  # its first 10 blocks
    assert abs(second.ttft_s - (0.1 + 16 / 1600)) < 1e-9  # behind the first prompt, then one block to compute


def test_round_robin_and_requests_from_rows():
    rows = [{"timestamp": 1000 * i, "hash_ids": [i], "output_length": 3, "input_length": 512} for i in range(6)]
    requests = requests_from_rows(rows, CONFIG)
    assert [r.arrival_s for r in requests] == [0, 1, 2, 3, 4, 5] and requests[0].output_tokens == 3
    assert [o.engine for o in simulate(requests, round_robin_router(), CONFIG)] == [0, 1, 2, 3, 0, 1]


def test_cache_aware_follows_its_tree_above_the_threshold_and_balances_past_both_gaps():
    route = cache_aware_router(CONFIG)
    engines = [SimEngine(f"e{i}") for i in range(3)]
    assert route(req(0, SHARED), 0.0, engines) == 0  # nothing matched: the least loaded, lowest index
    engines[0].jobs.append((0.0, 1.0, 2.0))
    assert route(req(0, SHARED[:4] + (50,)), 0.0, engines) == 0  # 4 of 5 blocks match: over 0.3, despite the load
    assert route(req(0, (70, 71, 72)), 0.0, engines) == 1  # no match: the least loaded
    engines[0].jobs.extend([(0.0, 1.0, 2.0)] * 70)  # 71 in flight on e0, none elsewhere: past both thresholds
    assert route(req(0, SHARED), 0.0, engines) == 1  # the least loaded (lowest index), not the deepest match


def test_the_gateway_policy_prefers_the_engine_holding_the_prefix_at_equal_load():
    engines = [SimEngine(f"e{i}") for i in range(3)]
    engines[2].insert(SHARED, 100)
    assert gateway_router(CONFIG)(req(0, SHARED + (1,)), 0.0, engines) == 2


def test_the_simulation_is_deterministic_and_its_summary_consistent():
    requests = [req(0.05 * i, SHARED[: 2 + i % 8] + (1000 + i,)) for i in range(200)]
    runs = {name: simulate(requests, make_router(name, CONFIG), CONFIG) for name in ("gateway", "cache_aware", "round_robin")}
    again = simulate(requests, make_router("gateway", CONFIG), CONFIG)
    assert again == runs["gateway"]
    for outcomes in runs.values():
        summary = summarise(outcomes, CONFIG.engines)
        assert summary["requests"] == 200 and 0 <= summary["hit_rate"] <= 1
        assert 0.25 <= summary["busiest_share"] <= 1 and summary["ttft_p50_s"] <= summary["ttft_p90_s"]
    # locality pays on a shared prefix: both cache-aware policies hit more than round robin
    hit = {name: summarise(o, CONFIG.engines)["hit_rate"] for name, o in runs.items()}
    assert hit["gateway"] > hit["round_robin"] and hit["cache_aware"] > hit["round_robin"]


def test_a_warm_prefills_a_popular_prefix_on_an_idle_engine_without_delaying_the_request():
    no_guard = replace(CONFIG.scorer, hot_spot_factor=float("inf"))  # the holder keeps every request here
    config = replace(CONFIG, engines=2, scorer=no_guard, warm=WarmPolicy(min_prefix_requests=1.5, min_blocks=4))
    route = gateway_router(config)
    engines = [SimEngine(f"e{i}") for i in range(2)]
    for i in range(2):  # two requests begin with the prefix: it is popular from the third on
        assert route(req(0, SHARED + (100 + i,)), float(i), engines) == 0
        engines[0].insert(SHARED + (100 + i,), 100)
    assert engines[1].cached_blocks(SHARED) == 0
    assert route(req(0, SHARED + (102,)), 2.0, engines) == 0  # the request stays with the holder ...
    assert engines[1].cached_blocks(SHARED) == 10  # ... and the idle engine prefilled the prefix (10 blocks)
    assert abs(engines[1].free_at - (2.0 + 160 / 1600)) < 1e-9 and engines[1].waiting_at(2.0) == 0
    off = gateway_router(replace(config, warm=WarmPolicy(min_prefix_requests=0)))
    cold = [SimEngine(f"e{i}") for i in range(2)]
    for i in range(3):
        off(req(0, SHARED + (100 + i,)), float(i), cold)
        cold[0].insert(SHARED + (100 + i,), 100)
    assert cold[1].cached_blocks(SHARED) == 0  # off at 0


def test_a_warm_yields_to_a_request_sent_to_its_engine():
    engine = SimEngine("e0")
    engine.insert(SHARED[:2], 100)  # 2 of the 10 blocks already held
    prefill_warm(engine, SHARED, 1.0, CONFIG)  # 8 blocks, 128 tokens: 1.0 .. 1.08 s
    assert engine.cached_blocks(SHARED) == 10 and abs(engine.free_at - 1.08) < 1e-9
    engine.yield_warm(1.04)  # halfway: a request sent here stops it
    assert engine.cached_blocks(SHARED) == 2 + 4  # what it completed stays cached, the rest is gone
    assert engine.free_at == 1.04 and engine.in_flight_at(1.04) == 0
    engine.yield_warm(1.05)  # nothing left to yield
    assert engine.cached_blocks(SHARED) == 6
    finished = SimEngine("e1")
    prefill_warm(finished, SHARED, 1.0, CONFIG)
    finished.yield_warm(2.0)  # a request after the warm's end: the warm had finished, all of it stays
    assert finished.cached_blocks(SHARED) == 10 and finished.warm is None


def test_in_a_simulation_a_request_never_waits_behind_a_warm():
    no_guard = replace(CONFIG.scorer, hot_spot_factor=float("inf"))
    config = replace(CONFIG, engines=2, scorer=no_guard, warm=WarmPolicy(min_prefix_requests=1.5, min_blocks=4))
    # A popular prefix on e0; at 2.0 a request with 20 more blocks of its own queues 0.2 s of prefill there
    # and a warm starts on e1; at 2.01 a short unrelated prompt goes to e1, the shorter queue.
    requests = [req(0.0, SHARED + (100,)), req(1.0, SHARED + (101,)), req(2.0, SHARED + tuple(range(200, 220))),
                req(2.01, (500, 501))]
    outcomes = simulate(requests, make_router("gateway", config), config)
    assert outcomes[3].engine == 1
    assert abs(outcomes[3].ttft_s - 32 / 1600) < 1e-9  # its own two blocks, nothing of the warm before them
