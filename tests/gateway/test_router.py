"""The routing decision: P/D or whole-request, which engines are ranked for each stage, and admission."""

from __future__ import annotations

from fleetctl.gateway.admission import EngineLoad, ModelSLO, RunningDecode
from fleetctl.gateway.router import MIXED, PD, Candidate, choose_mode, pd_disabled_by_flag, plan_route, scorer_policy
from fleetctl.gateway.scorer import EngineView, RouteRequest, RoutingSnapshot, ScorerPolicy, rank_engines

HASHES = list(range(100, 110))


def candidate(name: str, role: str, healthy: bool = True, cached: int = 0, waiting: int = 0, running: int = 0,
              share: float = 0.0, kv: float = 0.0) -> Candidate:
    view = EngineView(name, role, "c@r1", healthy, running, waiting, kv, 0, 2000.0, cached, share)
    load = EngineLoad(name, role, running=tuple(RunningDecode(1000) for _ in range(running)), max_num_seqs=4,
                      kv_headroom_tokens=10_000)
    return Candidate(view, load)


def test_pd_needs_the_model_flag_and_healthy_engines_of_both_roles() -> None:
    both = [candidate("p", "prefill"), candidate("d", "decode")]
    assert choose_mode(True, False, both) == (PD, None)
    assert choose_mode(False, False, both) == (MIXED, None)
    assert choose_mode(True, True, both) == (MIXED, "disabled by flag")
    assert choose_mode(True, False, [candidate("p", "prefill", healthy=False), both[1]]) == (MIXED, "no healthy prefill engine")
    assert choose_mode(True, False, [both[0]]) == (MIXED, "no healthy decode engine")


def test_the_flag_reads_common_truthy_values() -> None:
    assert pd_disabled_by_flag({"pd_disaggregation:m": False}, "m")
    assert pd_disabled_by_flag({"pd_disaggregation:m": "off"}, "m")
    assert not pd_disabled_by_flag({"pd_disaggregation:m": "true"}, "m")
    assert not pd_disabled_by_flag({"pd_disaggregation:other": False}, "m")
    assert not pd_disabled_by_flag({}, "m")  # the default: on


def test_pd_ranks_prefill_by_locality_and_decode_by_load() -> None:
    candidates = [candidate("p1", "prefill"), candidate("p2", "prefill", cached=8),
                  candidate("d1", "decode", cached=10, waiting=3), candidate("d2", "decode"), candidate("m", "mixed")]
    plan = plan_route(RouteRequest(HASHES, 160), 16, "c@r1", (PD, None), candidates, ScorerPolicy(), None)
    assert plan.mode == PD and plan.admission is None
    assert [r.engine_id for r in plan.candidates] == ["p2", "p1"]
    assert [r.engine_id for r in plan.decode_candidates] == ["d2", "d1"]  # d1's cache does not count, its queue does
    assert all(r.cached_blocks == 0 for r in plan.decode_candidates)


def test_whole_requests_prefer_mixed_engines_and_else_take_any_role() -> None:
    with_mixed = [candidate("p", "prefill", cached=10), candidate("m", "mixed")]
    plan = plan_route(RouteRequest(HASHES, 160), 16, "c@r1", (MIXED, "no healthy decode engine"), with_mixed, ScorerPolicy(), None)
    assert [r.engine_id for r in plan.candidates] == ["m"] and plan.fallback == "no healthy decode engine"
    without = [candidate("p", "prefill", healthy=False), candidate("d", "decode")]
    plan = plan_route(RouteRequest(HASHES, 160), 16, "c@r1", (MIXED, "no healthy prefill engine"), without, ScorerPolicy(), None)
    assert [r.engine_id for r in plan.candidates] == ["d"]


def test_sessions_stick_when_close_enough() -> None:
    candidates = [candidate("a", "mixed"), candidate("b", "mixed", waiting=1)]
    plan = plan_route(RouteRequest(HASHES, 160, session_id="s"), 16, "c@r1", (MIXED, None), candidates, ScorerPolicy(),
                      None, sessions={"s": "b"})
    assert plan.candidates[0].engine_id == "b" and plan.candidates[0].sticky


def test_admission_sees_only_the_engines_that_would_serve() -> None:
    slo = ModelSLO(ttft_slo_s=10.0, max_decode_slots=2)
    busy = [candidate("m1", "mixed", running=2), candidate("m2", "mixed", running=2)]
    plan = plan_route(RouteRequest(HASHES, 160), 16, "c@r1", (MIXED, None), busy, ScorerPolicy(), slo)
    assert not plan.admitted and "decode slots 3/2" in plan.admission.reason and plan.admission.retry_after_s >= 1
    free = busy + [candidate("m3", "mixed")]
    assert plan_route(RouteRequest(HASHES, 160), 16, "c@r1", (MIXED, None), free, ScorerPolicy(), slo).admitted
    pd = [candidate("p", "prefill"), candidate("d", "decode", running=2)]
    plan = plan_route(RouteRequest(HASHES, 160), 16, "c@r1", (PD, None), pd, ScorerPolicy(), slo)
    assert not plan.admitted and "on d" in plan.admission.reason


def test_prefix_routing_off_ranks_on_load_alone() -> None:
    views = [candidate("cached", "mixed", cached=40, waiting=2).view, candidate("idle", "mixed").view]
    request = RouteRequest(tuple(range(40)), 640, None, "c@r1")
    policy = ScorerPolicy()
    on = rank_engines(request, RoutingSnapshot(views), scorer_policy(policy, {}))
    off = rank_engines(request, RoutingSnapshot(views), scorer_policy(policy, {"prefix_routing": False}))
    assert on[0].engine_id == "cached" and off[0].engine_id == "idle"
    assert scorer_policy(policy, {"prefix_routing": True}) is policy
