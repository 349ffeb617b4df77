"""rank_engines: locality vs load in one score, the hot-spot guard, sessions; properties with hypothesis."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.gateway.scorer import EngineView, RankedEngine, RouteRequest, RoutingSnapshot, ScorerPolicy, rank_engines

POLICY = ScorerPolicy()
BLOCKS = tuple(range(100, 114))  # a 14-block prompt
REQUEST = RouteRequest(block_hashes=BLOCKS, num_prompt_tokens=14 * 16 + 5)


def engine(engine_id: str, **fields) -> EngineView:
    base = dict(
        role="mixed", class_ref="chat@r1", healthy=True, num_running=0, num_waiting=0, kv_cache_usage=0.3,
        queued_prefill_tokens=0, prefill_tokens_per_s=2000.0, cached_blocks=0, recent_share=0.25,
    )
    return EngineView(engine_id=engine_id, **{**base, **fields})


def order(ranked: list[RankedEngine]) -> list[str]:
    return [r.engine_id for r in ranked]


# --- examples ---


def test_cached_prefix_wins_at_equal_load_and_reason_says_why():
    snapshot = RoutingSnapshot([engine("a", cached_blocks=2), engine("b", cached_blocks=12, num_waiting=3, kv_cache_usage=0.41)])
    ranked = rank_engines(REQUEST, snapshot, POLICY)
    assert order(ranked) == ["b", "a"]
    assert ranked[0].reason.startswith("12/14 blocks cached, 3 waiting, 0 running, kv 41%, prefill ~")


def test_load_outweighs_a_short_cached_prefix():
    snapshot = RoutingSnapshot([engine("a", cached_blocks=2, queued_prefill_tokens=8000, num_waiting=10), engine("b")])
    assert order(rank_engines(REQUEST, snapshot, POLICY)) == ["b", "a"]


def test_unhealthy_other_class_and_other_role_engines_are_excluded():
    snapshot = RoutingSnapshot([
        engine("sick", healthy=False, cached_blocks=14),
        engine("old", class_ref="chat@r0", cached_blocks=14),
        engine("dec", role="decode"),
        engine("ok"),
    ])
    request = replace(REQUEST, class_ref="chat@r1", roles=frozenset({"mixed", "prefill"}))
    assert order(rank_engines(request, snapshot, POLICY)) == ["ok"]
    assert rank_engines(request, RoutingSnapshot([engine("sick", healthy=False)]), POLICY) == []


def test_nearly_full_kv_is_penalised():
    snapshot = RoutingSnapshot([engine("full", kv_cache_usage=0.98, cached_blocks=4), engine("roomy", kv_cache_usage=0.5)])
    ranked = rank_engines(REQUEST, snapshot, POLICY)
    assert order(ranked) == ["roomy", "full"] and "kv nearly full" in ranked[1].reason


def test_hot_spot_loses_its_locality_bonus():
    hot = engine("hot", cached_blocks=14, recent_share=0.7)
    snapshot = RoutingSnapshot([hot, engine("b", recent_share=0.1), engine("c", recent_share=0.1), engine("d", recent_share=0.1)])
    ranked = rank_engines(REQUEST, snapshot, POLICY)
    assert ranked[0].engine_id != "hot"
    assert ranked[-1].hot_spot_damped and ranked[-1].reason.endswith("hot-spot damped")
    unguarded = rank_engines(REQUEST, snapshot, replace(POLICY, hot_spot_factor=float("inf")))
    assert unguarded[0].engine_id == "hot"


def test_half_damping_lets_a_hot_spot_keep_what_it_would_answer_sooner():
    """At damping 0.5 (locality weight 2) a hot spot's hit counts once: the engine that would answer sooner wins."""
    half = replace(POLICY, hot_spot_damping=0.5)
    others = [engine("b", recent_share=0.1), engine("c", recent_share=0.1), engine("d", recent_share=0.1)]
    idle_hot = RoutingSnapshot([engine("hot", cached_blocks=14, recent_share=0.7), *others])
    ranked = rank_engines(REQUEST, idle_hot, half)
    assert ranked[0].engine_id == "hot" and ranked[0].hot_spot_damped
    assert rank_engines(REQUEST, idle_hot, POLICY)[0].engine_id != "hot"  # the default ignores its cache
    busy_hot = RoutingSnapshot([engine("hot", cached_blocks=14, recent_share=0.7, queued_prefill_tokens=2000), *others])
    assert rank_engines(REQUEST, busy_hot, half)[0].engine_id != "hot"  # a second of queue > 0.11 s recompute


def test_engines_sharing_hardware_have_no_hot_spot_guard():
    hot = engine("hot", cached_blocks=14, recent_share=0.9)
    snapshot = RoutingSnapshot([hot, engine("b", recent_share=0.05), engine("c", recent_share=0.05)])
    ranked = rank_engines(REQUEST, snapshot, replace(POLICY, engines_share_hardware=True))
    assert ranked[0].engine_id == "hot" and not any(r.hot_spot_damped for r in ranked)
    assert rank_engines(REQUEST, snapshot, POLICY)[0].engine_id != "hot"  # own hardware: the guard spills it


def test_engines_sharing_hardware_can_price_load_as_one_pool():
    # the holder's queue is 4 s of prefill; on shared cores the idle neighbour would wait for the same cores
    snapshot = RoutingSnapshot([engine("holder", cached_blocks=2, queued_prefill_tokens=8000), engine("idle")])
    sharing = replace(POLICY, engines_share_hardware=True, shared_hardware_own_load=1.0)
    assert order(rank_engines(REQUEST, snapshot, sharing)) == ["idle", "holder"]  # own load only
    assert order(rank_engines(REQUEST, snapshot, replace(sharing, shared_hardware_own_load=0.0))) == ["holder", "idle"]
    # the default, half its own load and half the pool's: a whole-prompt hit (0.11 s of prefill, counted twice)
    # outweighs half of a 0.35 s queue, not all of it
    assert ScorerPolicy().shared_hardware_own_load == 0.5
    queued = RoutingSnapshot([engine("holder", cached_blocks=14, queued_prefill_tokens=700), engine("idle")])
    assert order(rank_engines(REQUEST, queued, sharing)) == ["idle", "holder"]
    assert order(rank_engines(REQUEST, queued, replace(sharing, shared_hardware_own_load=0.5))) == ["holder", "idle"]
    own_hardware = replace(POLICY, shared_hardware_own_load=0.0)  # only where engines share hardware
    assert order(rank_engines(REQUEST, snapshot, own_hardware)) == ["idle", "holder"]
    # with no hit anywhere the pool's load ties, and the lower recent share wins
    cold = RoutingSnapshot([engine("busy", queued_prefill_tokens=8000, recent_share=0.6),
                            engine("quiet", recent_share=0.4)])
    assert order(rank_engines(REQUEST, cold, replace(sharing, shared_hardware_own_load=0.0))) == ["quiet", "busy"]


def test_session_sticks_within_margin_and_not_beyond():
    snapshot = RoutingSnapshot([engine("a", cached_blocks=14), engine("b", cached_blocks=13)], sessions={"s1": "b"})
    ranked = rank_engines(replace(REQUEST, session_id="s1"), snapshot, POLICY)
    assert order(ranked) == ["b", "a"] and ranked[0].sticky and "sticky session" in ranked[0].reason

    far = RoutingSnapshot([engine("a", cached_blocks=14), engine("b", queued_prefill_tokens=20_000)], sessions={"s1": "b"})
    assert order(rank_engines(replace(REQUEST, session_id="s1"), far, POLICY)) == ["a", "b"]
    gone = RoutingSnapshot([engine("a")], sessions={"s1": "b"})  # the session's engine left
    assert order(rank_engines(replace(REQUEST, session_id="s1"), gone, POLICY)) == ["a"]


def test_a_popular_shared_prefix_goes_where_the_load_is_lower():
    # a system prompt 30 recent requests began with, held by a busy engine; the idle one would recompute it once
    popular = replace(REQUEST, prefix_requests=(30.0,) * 14)
    snapshot = RoutingSnapshot([engine("holder", cached_blocks=12, num_waiting=2, num_running=2),
                                engine("idle")])
    assert order(rank_engines(popular, snapshot, POLICY)) == ["holder", "idle"]  # off by default
    ranked = rank_engines(popular, snapshot, replace(POLICY, shared_prefix_requests=2.0))
    assert order(ranked) == ["idle", "holder"]
    assert "shared prefix (x0.07)" in ranked[1].reason


def test_a_sessions_own_history_keeps_its_full_price():
    # each prefix began only the session's two earlier turns: no spreading, the holder keeps it
    history = replace(REQUEST, prefix_requests=(2.0,) * 14)
    snapshot = RoutingSnapshot([engine("holder", cached_blocks=12, num_waiting=2, num_running=2), engine("idle")])
    ranked = rank_engines(history, snapshot, replace(POLICY, shared_prefix_requests=2.0))
    assert order(ranked) == ["holder", "idle"] and "shared prefix" not in ranked[0].reason


def test_shared_prefix_pricing_is_off_where_engines_share_hardware():
    popular = replace(REQUEST, prefix_requests=(30.0,) * 14)
    snapshot = RoutingSnapshot([engine("holder", cached_blocks=12, num_waiting=2, num_running=2), engine("idle")])
    policy = replace(POLICY, shared_prefix_requests=2.0, engines_share_hardware=True)
    assert order(rank_engines(popular, snapshot, policy)) == ["holder", "idle"]


def test_running_decodes_priced_in_measured_decode_steps():
    # 2 running decodes at 100 ms a step outweigh a 2-block hit once each costs a step, not a fixed 5 ms
    snapshot = RoutingSnapshot([engine("busy", cached_blocks=2, num_running=2, decode_step_s=0.1),
                                engine("idle", decode_step_s=0.1)])
    assert order(rank_engines(REQUEST, snapshot, POLICY)) == ["busy", "idle"]
    assert order(rank_engines(REQUEST, snapshot, replace(POLICY, running_cost_steps=1.0))) == ["idle", "busy"]
    unmeasured = RoutingSnapshot([replace(e, decode_step_s=0.0) for e in snapshot.engines])
    assert order(rank_engines(REQUEST, unmeasured, replace(POLICY, running_cost_steps=1.0))) == ["busy", "idle"]


# --- properties ---

loads = st.fixed_dictionaries({
    "num_running": st.integers(0, 64),
    "num_waiting": st.integers(0, 32),
    "kv_cache_usage": st.floats(0.0, 1.0),
    "queued_prefill_tokens": st.integers(0, 50_000),
    "prefill_tokens_per_s": st.floats(100.0, 50_000.0),
    "recent_share": st.floats(0.0, 1.0),
})
others = st.lists(st.builds(lambda c, l: (c, l), st.integers(0, 14), loads), max_size=4)


def with_others(pair: list[EngineView], extra) -> RoutingSnapshot:
    return RoutingSnapshot(pair + [engine(f"x{i}", cached_blocks=c, **l) for i, (c, l) in enumerate(extra)])


@settings(max_examples=300, deadline=None)
@given(loads, st.integers(0, 14), st.integers(0, 14), st.integers(1, 14 * 16 + 15), others, st.booleans())
def test_longer_cached_prefix_never_ranks_lower_at_equal_load(load, c1, c2, prompt_tokens, extra, a_first):
    shorter, longer = sorted((c1, c2))
    a, b = engine("a", cached_blocks=longer, **load), engine("b", cached_blocks=shorter, **load)
    ranked = order(rank_engines(replace(REQUEST, num_prompt_tokens=prompt_tokens), with_others([a, b] if a_first else [b, a], extra), POLICY))
    assert ranked.index("a") < ranked.index("b")


# recent requests per prefix along a 14-block chain never rise (a longer prefix began fewer requests)
popularities = st.lists(st.floats(0.0, 100.0), min_size=14, max_size=14).map(lambda xs: tuple(sorted(xs, reverse=True)))


@settings(max_examples=300, deadline=None)
@given(loads, st.integers(0, 14), st.integers(0, 14), popularities, st.floats(0.0, 8.0), st.floats(0.0, 3.0), others)
def test_longer_cached_prefix_never_ranks_lower_with_shared_prefix_pricing(load, c1, c2, popularity, shared, steps, extra):
    shorter, longer = sorted((c1, c2))
    a = engine("a", cached_blocks=longer, decode_step_s=0.05, **load)
    b = engine("b", cached_blocks=shorter, decode_step_s=0.05, **load)
    policy = replace(POLICY, shared_prefix_requests=shared, running_cost_steps=steps)
    ranked = order(rank_engines(replace(REQUEST, prefix_requests=popularity), with_others([b, a], extra), policy))
    assert ranked.index("a") < ranked.index("b")


@settings(max_examples=300, deadline=None)
@given(loads, st.integers(0, 14), st.integers(0, 8), st.integers(0, 8), st.integers(0, 5000), st.floats(0.0, 0.5), others)
def test_lower_load_ranks_higher_at_equal_cache(load, cached, more_waiting, more_running, more_queued, more_kv, extra):
    busier = dict(
        load,
        num_waiting=load["num_waiting"] + more_waiting,
        num_running=load["num_running"] + more_running,
        queued_prefill_tokens=load["queued_prefill_tokens"] + more_queued,
        kv_cache_usage=min(1.0, load["kv_cache_usage"] + more_kv),
    )
    if more_waiting == more_running == more_queued == 0:
        busier["num_waiting"] += 1  # strictly busier in at least one of waiting / running / queued (KV may tie)
    idle, busy = engine("idle", cached_blocks=cached, **load), engine("busy", cached_blocks=cached, **busier)
    ranked = order(rank_engines(REQUEST, with_others([busy, idle], extra), POLICY))
    assert ranked.index("idle") < ranked.index("busy")


def simulate(n: int, prefix_blocks: int, throughput: float, utilisation: float, spread: bool, policy: ScorerPolicy,
             requests: int = 2000, warmup: int = 200, alpha: float = 0.05) -> list[int]:
    """A stream of requests sharing one prefix, held at first by engine 0 only; how many each engine got.

    Requests arrive evenly at `utilisation` of the fleet's prefill capacity counted without any cache (an
    overloaded fleet is admission's problem, not routing's: there the cached engine's cheaper prefills
    rightly earn it more traffic). Each engine's queue drains at its throughput; recent shares are an EWMA
    of choices. `spread`: engines cache the prefix once they serve it (the real world); otherwise engine 0
    keeps the only copy (the worst case for the guard)."""
    prompt = prefix_blocks * 16 + 7
    interval_s = prompt / (n * throughput * utilisation)
    request = RouteRequest(block_hashes=tuple(range(prefix_blocks)), num_prompt_tokens=prompt)
    cached, queued, share, counts = [prefix_blocks] + [0] * (n - 1), [0.0] * n, [0.0] * n, [0] * n
    for i in range(requests):
        queued = [max(0.0, q - throughput * interval_s) for q in queued]
        snapshot = RoutingSnapshot([
            engine(f"e{k}", cached_blocks=cached[k], queued_prefill_tokens=int(queued[k]), num_waiting=int(queued[k] // prompt),
                   prefill_tokens_per_s=throughput, recent_share=share[k])
            for k in range(n)
        ])
        chosen = int(rank_engines(request, snapshot, policy)[0].engine_id[1:])
        queued[chosen] += prompt - min(cached[chosen] * 16, prompt)
        if spread:
            cached[chosen] = prefix_blocks
        share = [(1 - alpha) * s + alpha * (k == chosen) for k, s in enumerate(share)]
        if i >= warmup:
            counts[chosen] += 1
    return counts


@settings(max_examples=30, deadline=None)
@given(
    st.integers(2, 6), st.integers(1, 64), st.floats(500.0, 20_000.0), st.floats(0.05, 0.95), st.booleans(),
    st.floats(1.2, 3.0),
)
def test_hot_spot_guard_bounds_the_busiest_engines_share(n, prefix_blocks, throughput, utilisation, spread, factor):
    counts = simulate(n, prefix_blocks, throughput, utilisation, spread, replace(POLICY, hot_spot_factor=factor))
    shares = [c / sum(counts) for c in counts]
    assert max(shares) <= factor * (sum(shares) / n) + 0.05


def test_without_the_guard_one_engine_takes_everything():
    counts = simulate(4, 14, 20_000.0, 0.5, spread=False, policy=replace(POLICY, hot_spot_factor=float("inf")))
    assert counts[0] == sum(counts)


# --- node KV tiers: a tier hit is priced by its measured fetch time ---

RECOMPUTE_S_PER_BLOCK = 16 / 2000.0  # engine()'s throughput


def test_memory_beats_dram_beats_disk_beats_recompute_at_equal_load():
    snapshot = RoutingSnapshot([
        engine("none"),
        engine("disk", cached_blocks=12, tier_blocks=(("STORAGE", 12),)),
        engine("dram", cached_blocks=12, tier_blocks=(("CPU", 12),)),
        engine("memory", cached_blocks=12),
    ])
    ranked = rank_engines(REQUEST, snapshot, POLICY)
    assert order(ranked) == ["memory", "dram", "disk", "none"]
    disk = ranked[2]
    assert disk.tier_blocks == (("STORAGE", 12),) and disk.fetch_s == 12 * dict(POLICY.default_tier_fetch_s)["STORAGE"]
    assert "12/14 blocks cached (12 in STORAGE tier)" in disk.reason


def test_a_tier_hit_beats_recomputing_only_when_its_measured_fetch_cost_says_so():
    def ranked_with(disk_s_per_block: float) -> list[str]:
        tiered = engine("tiered", cached_blocks=12, tier_blocks=(("STORAGE", 12),),
                        tier_fetch_s=(("STORAGE", disk_s_per_block),))
        return order(rank_engines(REQUEST, RoutingSnapshot([tiered, engine("cold")]), POLICY))

    cheap = 0.5 * RECOMPUTE_S_PER_BLOCK  # measured: fetching a block takes half the time computing it does
    dear = 1.1 * POLICY.locality_weight * RECOMPUTE_S_PER_BLOCK  # more than the hit is worth
    assert ranked_with(cheap) == ["tiered", "cold"]
    assert ranked_with(dear) == ["cold", "tiered"]


def test_a_partly_tiered_run_pays_only_for_the_tier_blocks():
    view = engine("a", cached_blocks=10, tier_blocks=(("CPU", 4), ("STORAGE", 2)),
                  tier_fetch_s=(("CPU", 0.001),))  # DRAM measured; disk not yet: the default
    (ranked,) = rank_engines(REQUEST, RoutingSnapshot([view]), POLICY)
    assert view.memory_blocks == 4
    assert abs(ranked.fetch_s - (4 * 0.001 + 2 * dict(POLICY.default_tier_fetch_s)["STORAGE"])) < 1e-12


@settings(max_examples=200, deadline=None)
@given(
    blocks=st.integers(1, 14),
    cpu_s=st.floats(0.0, 0.05), extra_s=st.floats(0.0, 0.05),
    load=st.integers(0, 5), throughput=st.floats(200.0, 20_000.0),
)
def test_at_equal_load_memory_ranks_above_a_cheaper_tier_above_a_dearer_one(blocks, cpu_s, extra_s, load, throughput):
    costs = (("CPU", cpu_s), ("STORAGE", cpu_s + extra_s))
    common = dict(cached_blocks=blocks, num_waiting=load, prefill_tokens_per_s=throughput, tier_fetch_s=costs)
    snapshot = RoutingSnapshot([
        engine("c-storage", tier_blocks=(("STORAGE", blocks),), **common),
        engine("b-cpu", tier_blocks=(("CPU", blocks),), **common),
        engine("a-memory", **common),
    ])
    scores = {r.engine_id: r.score for r in rank_engines(REQUEST, snapshot, POLICY)}
    assert scores["a-memory"] >= scores["b-cpu"] >= scores["c-storage"]


@settings(max_examples=200, deadline=None)
@given(blocks=st.integers(1, 14), per_block_s=st.floats(0.0, 0.1), throughput=st.floats(200.0, 20_000.0))
def test_a_tier_hit_outranks_recompute_exactly_when_locality_outweighs_its_fetch(blocks, per_block_s, throughput):
    tiered = engine("tiered", cached_blocks=blocks, tier_blocks=(("CPU", blocks),), prefill_tokens_per_s=throughput,
                    tier_fetch_s=(("CPU", per_block_s),))
    cold = engine("cold", prefill_tokens_per_s=throughput)
    saved = min(blocks * 16, REQUEST.num_prompt_tokens) / throughput
    worth = POLICY.locality_weight * saved - blocks * per_block_s
    first = rank_engines(REQUEST, RoutingSnapshot([cold, tiered]), POLICY)[0].engine_id
    if worth > 1e-9:
        assert first == "tiered"
    elif worth < -1e-9:
        assert first == "cold"


def test_every_scorer_setting_of_the_gateway_reaches_the_policy_with_the_same_default():
    from dataclasses import fields

    from fleetctl.gateway.service import SCORER_SETTINGS, scorer_policy_of
    from fleetctl.gateway.settings import GatewaySettings

    policy_fields = {f.name: f.default for f in fields(ScorerPolicy)}
    shared = set(GatewaySettings.model_fields) & set(policy_fields)
    assert shared == set(SCORER_SETTINGS)  # no knob left out of the mapping
    defaults = GatewaySettings(static_engines=("http://127.0.0.1:1",))
    assert scorer_policy_of(defaults) == ScorerPolicy()
    tuned = GatewaySettings(static_engines=("http://127.0.0.1:1",), shared_prefix_requests=3.0, running_cost_steps=1.5,
                            shared_hardware_own_load=0.25)
    policy = scorer_policy_of(tuned)
    assert (policy.shared_prefix_requests, policy.running_cost_steps, policy.shared_hardware_own_load) == (3.0, 1.5, 0.25)
