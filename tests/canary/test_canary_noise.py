"""A stream's p0 from the reference's recorded noise: the Clopper-Pearson upper bound (against known
values), pooled as documented, never below the floor, and the answer test's prompts."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from fleetctl.canary import noise
from fleetctl.canary.cusum import MAX_P0
from fleetctl.canary.types import ConditionNoise, PromptReference, Reference


def prompt(pid: str, noise_by_condition: dict[int, tuple[int, int]], expected_pass: bool | None = None) -> PromptReference:
    return PromptReference(prompt_id=pid, tokens=[1], text="x", top_logprobs=[[(1, 0.0)]], expected_pass=expected_pass,
                           noise={c: ConditionNoise(runs=r, diverged=d) for c, (r, d) in noise_by_condition.items()})


def reference(*prompts: PromptReference) -> Reference:
    return Reference(golden_set="g", golden_version=1, model="m", class_ref="chat@r1", correctness_digest="d",
                     recorded_at=datetime(2026, 12, 1, tzinfo=timezone.utc), recorded_by="test",
                     prompts={p.prompt_id: p for p in prompts})


@pytest.mark.parametrize(("k", "n", "bound"), [
    (0, 10, 0.2589),  # 1 - 0.05^(1/10)
    (1, 10, 0.3942),
    (5, 100, 0.1024),
    (0, 300, 0.00994),  # the "rule of three": about 3/n
])
def test_clopper_pearson_upper_bound(k: int, n: int, bound: float) -> None:
    assert noise.upper_bound(k, n) == pytest.approx(bound, abs=2e-4)
    assert noise.binomial_cdf(k, n, noise.upper_bound(k, n)) == pytest.approx(0.05, abs=1e-6) or k == 0


def test_a_pinned_stream_uses_its_condition_and_the_production_stream_pools_them() -> None:
    ref = reference(prompt("a", {1: (100, 0), 4: (100, 10)}), prompt("b", {1: (100, 0), 4: (100, 10)}))
    assert noise.stream_p0(ref, 1, 0.001) == pytest.approx(noise.upper_bound(0, 200))
    assert noise.stream_p0(ref, 4, 0.001) == pytest.approx(noise.upper_bound(20, 200))
    assert noise.stream_p0(ref, None, 0.001) == pytest.approx(noise.upper_bound(20, 400))
    assert noise.stream_p0(ref, 16, 0.001) == noise.stream_p0(ref, None, 0.001)  # not recorded: borrows


def test_never_below_the_floor_and_capped() -> None:
    clean = reference(prompt("a", {1: (1000, 0)}))
    assert noise.stream_p0(clean, 1, 0.01) == 0.01  # the bound, 0.003, is below the floor
    assert noise.stream_p0(reference(prompt("a", {1: (10, 9)})), 1, 0.01) == MAX_P0
    assert noise.stream_p0(reference(prompt("a", {})), 1, 0.01) == MAX_P0  # nothing recorded: most tolerant


def test_the_answer_test_counts_only_prompts_whose_reference_answer_passed() -> None:
    ref = reference(prompt("right", {1: (100, 1)}, expected_pass=True), prompt("wrong", {1: (100, 50)}, expected_pass=False),
                    prompt("free", {1: (100, 50)}))
    assert noise.answer_p0(ref, 1, 0.001) == pytest.approx(noise.upper_bound(1, 100))
    assert noise.answer_p0(reference(prompt("free", {1: (10, 0)})), 1, 0.01) is None
