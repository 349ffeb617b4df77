"""plan_cross_node_fetch: fetch another node's tier blocks only when the link beats what the engine would do
without them (its own tier, then recompute); pure, with the measured link or the policy's defaults."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.gateway.cross_node import (CrossNodeFetch, LinkEstimate, LocalCosts, PeerFetchPolicy, PeerOffer,
                                         link_estimate, plan_cross_node_fetch)

BLOCK_BYTES = 72 * 1024.0  # one block's K/V bytes (the tiny model's order of magnitude; any size will do)
RECOMPUTE = 16 / 450.0  # 450 prompt tokens per second: seconds to compute one block
COLD = LocalCosts(memory_blocks=0, tier_blocks=0, tier_fetch_s=0.0, recompute_s_per_block=RECOMPUTE,
                  block_bytes=BLOCK_BYTES)


def link(mb_per_s: float, rtt_s: float = 0.0, measured: bool = True) -> LinkEstimate:
    return LinkEstimate(mb_per_s * 1e6, rtt_s, measured)


def test_a_fast_link_fetches_and_a_slow_one_recomputes():
    offer = PeerOffer("b-1", "node-b", "http://b", tier_run=20)
    fast = plan_cross_node_fetch("a-1", COLD, [offer], {"node-b": link(500)})
    slow = plan_cross_node_fetch("a-1", COLD, [offer], {"node-b": link(0.5)})
    assert isinstance(fast, CrossNodeFetch) and fast.fetch and fast.blocks == 20 and fast.gain_blocks == 20
    assert abs(fast.without_s - 20 * RECOMPUTE) < 1e-12
    assert abs(fast.with_s - 20 * BLOCK_BYTES / 500e6) < 1e-12
    assert slow is not None and not slow.fetch
    assert fast.kv_transfer_params == {"tier_peer": "http://b", "tier_peer_node": "node-b"}
    assert fast.reason.startswith("fetch: 20 blocks from b-1 on node-b") and "(measured)" in fast.reason


def test_the_peer_carries_the_blocks_after_memory_and_is_weighed_against_the_own_tier_and_recompute():
    local = LocalCosts(memory_blocks=4, tier_blocks=6, tier_fetch_s=6 * 0.005, recompute_s_per_block=RECOMPUTE,
                       block_bytes=BLOCK_BYTES)
    plan = plan_cross_node_fetch("a-1", local, [PeerOffer("b-1", "node-b", "http://b", 16)], {"node-b": link(100)})
    assert plan is not None and plan.blocks == 12 and plan.gain_blocks == 6
    assert abs(plan.without_s - (0.03 + 6 * RECOMPUTE)) < 1e-12


def test_no_plan_when_no_peer_holds_more_than_the_engine_reaches():
    local = LocalCosts(8, 0, 0.0, RECOMPUTE, BLOCK_BYTES)
    offers = [PeerOffer("b-1", "node-b", "http://b", 8), PeerOffer("c-1", "node-c", "http://c", 3)]
    assert plan_cross_node_fetch("a-1", local, offers, {"node-b": link(100), "node-c": link(100)}) is None
    assert plan_cross_node_fetch("a-1", local, [], {}) is None


def test_the_peer_that_saves_the_most_is_chosen():
    offers = [PeerOffer("b-1", "node-b", "http://b", 10), PeerOffer("c-1", "node-c", "http://c", 18)]
    plan = plan_cross_node_fetch("a-1", COLD, offers, {"node-b": link(1000), "node-c": link(1000)})
    assert plan is not None and plan.peer == "c-1"


def test_the_link_is_the_engines_measurement_else_the_policys_default():
    policy = PeerFetchPolicy(default_bandwidth_bytes_per_s=50e6, default_rtt_s=0.004)
    assert link_estimate({"node-b": (2e6, 0.01)}, "node-b", policy) == LinkEstimate(2e8, 0.0, True)
    assert link_estimate({"node-b": (2e6, 0.01)}, "node-c", policy) == LinkEstimate(50e6, 0.004, False)
    assert link_estimate({"node-b": (0.0, 0.0)}, "node-b", policy).measured is False


@settings(max_examples=300, deadline=None)
@given(run=st.integers(1, 200), memory=st.integers(0, 50), mb_per_s=st.floats(0.01, 10_000.0),
       rtt=st.floats(0.0, 0.05), tokens_per_s=st.floats(50.0, 50_000.0))
def test_the_verdict_is_fetch_exactly_when_the_transfer_is_faster(run, memory, mb_per_s, rtt, tokens_per_s):
    local = LocalCosts(memory, 0, 0.0, 16 / tokens_per_s, BLOCK_BYTES)
    plan = plan_cross_node_fetch("a-1", local, [PeerOffer("b-1", "node-b", "http://b", memory + run)],
                                 {"node-b": link(mb_per_s, rtt)})
    assert plan is not None
    transfer = rtt + run * BLOCK_BYTES / (mb_per_s * 1e6)
    assert plan.fetch == (transfer < run * 16 / tokens_per_s)
    faster = plan_cross_node_fetch("a-1", local, [PeerOffer("b-1", "node-b", "http://b", memory + run)],
                                   {"node-b": link(mb_per_s * 2, rtt)})
    assert faster is not None and (faster.fetch or not plan.fetch)  # more bandwidth never turns a fetch down
