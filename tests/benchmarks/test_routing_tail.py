"""The routing benchmark's tail diagnosis: each slow request gets the cause the gateway's own decision shows."""

from __future__ import annotations

from benchmarks.routing_tail import Decision, predecessor, tail_causes

A = list(range(100, 164))  # a 4-block prompt
B = A + list(range(500, 532))  # A's next turn: A plus 2 blocks
C = list(range(900, 964))  # unrelated


def row(engine: str, cached: int, **load) -> dict:
    return {"engine": engine, "cached_blocks": cached, "hot_spot_damped": load.pop("damped", False),
            "num_waiting": load.get("waiting", 0), "queued_prefill_tokens": load.get("queued", 0)}


def test_a_turn_finds_its_predecessor():
    assert predecessor([A, C, B], 2) == 0
    assert predecessor([A, C, B], 1) is None
    assert predecessor([A, A], 1) is None  # the same prompt again does not extend it


def test_each_tail_request_gets_the_first_cause_that_applies():
    decisions = [
        Decision(A, 0.1, "e1", [row("e1", 0), row("e2", 0)]),                      # fast: not in the tail
        Decision(B, 1.0, "e2", [row("e1", 3, damped=True), row("e2", 0)]),         # the holder was hot-spot damped
        Decision(B, 1.0, "e2", [row("e1", 3), row("e2", 0, waiting=0)]),           # passed over for load
        Decision(B, 1.0, "e2", [row("e1", 0), row("e2", 0)]),                      # A was on e1; the index knew nothing
        Decision(C, 1.0, "e1", [row("e1", 0, waiting=2), row("e2", 0, waiting=3)]),  # queued
        Decision(C + [1] * 64, 1.0, "e2", [row("e1", 4), row("e2", 4)]),          # C's blocks again, served where held
        Decision(list(range(2000, 2064)), 1.0, "e1", [row("e1", 0), row("e2", 0)]),  # a new prefix
    ]
    report = tail_causes(decisions, p90_s=0.5)
    assert report.requests == 6
    assert {c: n for c, n in report.causes.items() if n} == {
        "passed_over_hot_spot": 1, "passed_over_load": 1, "session_break": 1, "queued": 1, "other": 1, "cold_prefix": 1}
    assert report.examples["session_break"] == [3] and report.ttft_by_cause["queued"] == 1.0


def test_failed_requests_are_left_out():
    report = tail_causes([Decision(A, float("nan"), "e1", [row("e1", 0)])], p90_s=0.0)
    assert report.requests == 0
