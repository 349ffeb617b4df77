"""plan_warm: which idle engine gets a popular prefix ahead of need, and when none does; properties with hypothesis."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleetctl.gateway.prefix_warming import WarmPolicy, counts_popularity, plan_warm, popular_blocks
from fleetctl.gateway.scorer import EngineView, RouteRequest, ScorerPolicy

POLICY = WarmPolicy(min_prefix_requests=8, min_blocks=4)
# an 18-block prompt: 16 blocks of a tenant's system prompt 30 recent requests began with, then the user's turn
POPULAR = RouteRequest(block_hashes=tuple(range(18)), num_prompt_tokens=18 * 16 + 3,
                       prefix_requests=(30.0,) * 16 + (1.0, 0.0))


def engine(engine_id: str, **fields) -> EngineView:
    base = dict(role="mixed", class_ref="chat@r1", healthy=True, num_running=0, num_waiting=0, kv_cache_usage=0.3,
                queued_prefill_tokens=0, prefill_tokens_per_s=400.0, cached_blocks=0, recent_share=0.5)
    return EngineView(engine_id=engine_id, **{**base, **fields})


def plan(engines, request=POPULAR, chosen="a", warming=(), policy=POLICY, share_hardware=False):
    return plan_warm(request, chosen, engines, frozenset(warming), policy, share_hardware)


def test_popular_blocks_is_the_leading_run_above_the_threshold():
    assert popular_blocks((30.0, 30.0, 9.0, 2.0, 40.0), 8) == 3
    assert popular_blocks((), 8) == 0
    assert popular_blocks((7.9,), 8) == 0


def test_an_idle_engine_without_the_prefix_is_warmed_with_the_popular_blocks_only():
    warm = plan([engine("a", cached_blocks=17, num_running=1, recent_share=0.7), engine("b", recent_share=0.3)])
    assert warm is not None
    assert (warm.engine_id, warm.blocks, warm.cached_blocks, warm.prefix_requests) == ("b", 16, 0, 30.0)


def test_off_at_zero_and_where_engines_share_hardware():
    engines = [engine("a", cached_blocks=17), engine("b")]
    assert plan(engines, policy=WarmPolicy()) is not None  # the default warms at 8 recent requests
    assert plan(engines, policy=WarmPolicy(min_prefix_requests=0)) is None
    assert plan(engines, share_hardware=True) is None


def test_popularity_is_counted_only_for_a_reader_on_engines_with_their_own_hardware():
    off = WarmPolicy(min_prefix_requests=0)
    assert counts_popularity(ScorerPolicy(), WarmPolicy())  # warming, the default, reads it
    assert counts_popularity(ScorerPolicy(shared_prefix_requests=2), off)  # the scorer's shared-prefix price does
    assert not counts_popularity(ScorerPolicy(), off)  # nothing reads it
    assert not counts_popularity(ScorerPolicy(engines_share_hardware=True, shared_prefix_requests=2), WarmPolicy())


def test_no_warm_for_an_unpopular_or_short_prefix():
    engines = [engine("a", cached_blocks=17), engine("b")]
    session_history = RouteRequest(tuple(range(18)), 291, prefix_requests=(5.0,) * 17 + (0.0,))
    assert plan(engines, request=session_history) is None
    short = RouteRequest(tuple(range(18)), 291, prefix_requests=(30.0,) * 3 + (1.0,) * 15)  # a 3-block preamble
    assert plan(engines, request=short) is None


def test_busy_engines_the_chosen_one_and_engines_already_warming_are_not_warmed():
    assert plan([engine("a"), engine("b", num_running=1)]) is None
    assert plan([engine("a"), engine("b", num_waiting=1)]) is None
    assert plan([engine("a"), engine("b", queued_prefill_tokens=64)]) is None
    assert plan([engine("a")]) is None  # the request goes to the only engine
    assert plan([engine("a"), engine("b")], warming={"b"}) is None


def test_an_engine_holding_the_whole_prefix_needs_no_warm_and_a_partial_holder_gets_the_rest():
    assert plan([engine("a"), engine("b", cached_blocks=16)]) is None
    warm = plan([engine("a"), engine("b", cached_blocks=10)])
    assert warm is not None and (warm.blocks, warm.cached_blocks) == (16, 10)


def test_ineligible_engines_are_never_warmed():
    request = RouteRequest(POPULAR.block_hashes, POPULAR.num_prompt_tokens, class_ref="chat@r1",
                           prefix_requests=POPULAR.prefix_requests)
    assert plan([engine("a"), engine("sick", healthy=False)], request=request) is None
    assert plan([engine("a"), engine("old", class_ref="chat@r0")], request=request) is None
    assert plan([engine("a"), engine("dec", role="decode")], request=request) is None


def test_the_least_used_idle_engine_is_warmed():
    engines = [engine("a", num_running=2), engine("b", recent_share=0.3), engine("c", recent_share=0.1),
               engine("d", recent_share=0.1, cached_blocks=2)]
    warm = plan(engines)
    assert warm is not None and warm.engine_id == "c"


idle_or_busy = st.builds(
    lambda i, running, waiting, queued, cached, share: engine(
        f"e{i}", num_running=running, num_waiting=waiting, queued_prefill_tokens=queued, cached_blocks=cached,
        recent_share=share),
    st.integers(0, 99), st.integers(0, 2), st.integers(0, 2), st.sampled_from([0, 64]), st.integers(0, 18),
    st.floats(0, 1),
)


@given(st.lists(idle_or_busy, min_size=1, max_size=6, unique_by=lambda e: e.engine_id),
       st.lists(st.floats(0, 40), min_size=0, max_size=18).map(lambda xs: sorted(xs, reverse=True)),
       st.floats(1, 20))
def test_a_warm_goes_only_to_an_idle_other_engine_missing_part_of_a_popular_prefix(engines, counts, threshold):
    request = RouteRequest(tuple(range(len(counts))), 16 * len(counts) + 1, prefix_requests=tuple(counts))
    policy = WarmPolicy(min_prefix_requests=threshold, min_blocks=4)
    chosen = engines[0].engine_id
    warm = plan(engines, request=request, chosen=chosen, policy=policy)
    if warm is None:
        return
    target = next(e for e in engines if e.engine_id == warm.engine_id)
    assert warm.engine_id != chosen
    assert target.num_running == target.num_waiting == target.queued_prefill_tokens == 0
    assert 4 <= warm.blocks == popular_blocks(counts, threshold)
    assert all(c >= threshold for c in counts[: warm.blocks])
    assert target.cached_blocks < warm.blocks and warm.cached_blocks == target.cached_blocks
