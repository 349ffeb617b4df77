"""score_probe, table-driven: exact and tolerance modes, the distance over the matching prefix, the expected
answer, and which prompts take part in the answer test."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from fleetctl.canary.scoring import score_probe
from fleetctl.canary.types import CompareMode, ConditionNoise, Expected, GoldenPrompt, ProbeOutput, PromptReference, Tolerance

LN_HALF = math.log(0.5)
SURE = [(1, 0.0)]  # all mass on token 1
SPLIT = [(1, LN_HALF), (2, LN_HALF)]  # half on 1, half on 2
OTHER = [(3, 0.0)]  # disjoint from SURE


def ref(tokens: list[int], tops: list[list[tuple[int, float]]], expected_pass: bool | None = None) -> PromptReference:
    return PromptReference(prompt_id="p", tokens=tokens, text="", top_logprobs=tops, expected_pass=expected_pass)


def out(tokens: list[int], tops: list[list[tuple[int, float]]], text: str = "") -> ProbeOutput:
    return ProbeOutput(prompt_id="p", tokens=tokens, text=text, top_logprobs=tops)


PLAIN = GoldenPrompt(id="p", prompt="2+2=")
WITH_EXPECTED = GoldenPrompt(id="p", prompt="2+2=", expected=Expected(exact="4"))
TOL = Tolerance(max_distance=0.3, require_expected=True)
TOL_LAX = Tolerance(max_distance=0.3, require_expected=False)


@dataclass(frozen=True)
class Row:
    name: str
    output: ProbeOutput
    reference: PromptReference
    prompt: GoldenPrompt
    mode: CompareMode
    tolerance: Tolerance
    match: bool
    first_divergence: int | None
    distance: float
    diverged: bool
    expected_pass: bool | None = None
    answer_bad: bool | None = None
    noise: ConditionNoise | None = None


ROWS = [
    Row("identical answers match, distance 0", out([1, 1], [SURE, SURE]), ref([1, 1], [SURE, SURE]), PLAIN, "exact",
        TOL, match=True, first_divergence=None, distance=0.0, diverged=False),
    Row("exact: same tokens, shifted distributions -> diverged (a reduced-precision KV cache flips no token)",
        out([1, 1], [SPLIT, SURE]), ref([1, 1], [SURE, SURE]), PLAIN, "exact", TOL, match=True,
        first_divergence=None, distance=0.25, diverged=True),
    Row("exact: a distance within the floor is noise", out([1], [[(1, -1e-6), (2, -14.0)]]), ref([1], [SURE]),
        PLAIN, "exact", TOL, match=True, first_divergence=None,
        distance=math.exp(-14.0) / (math.exp(-1e-6) + math.exp(-14.0)), diverged=False),
    Row("exact: one token differs -> diverged; distance covers the prefix and the diverging position",
        out([1, 3, 1], [SURE, OTHER, OTHER]), ref([1, 1, 1], [SURE, SURE, SURE]), PLAIN, "exact", TOL,
        match=False, first_divergence=1, distance=0.5, diverged=True),
    Row("exact: a shorter answer diverges where it ends", out([1], [SURE]), ref([1, 1], [SURE, SURE]), PLAIN,
        "exact", TOL, match=False, first_divergence=1, distance=0.0, diverged=True),
    Row("exact: a first-token divergence has a distance (position 0 is comparable)", out([3], [OTHER]),
        ref([1], [SURE]), PLAIN, "exact", TOL, match=False, first_divergence=0, distance=1.0, diverged=True),
    Row("tolerance: different tokens within the distance are not diverged", out([1, 2], [SURE, SPLIT]),
        ref([1, 1], [SURE, SPLIT]), PLAIN, "tolerance", TOL, match=False, first_divergence=1, distance=0.0,
        diverged=False),
    Row("tolerance: beyond max_distance is diverged", out([3], [OTHER]), ref([1], [SURE]), PLAIN, "tolerance",
        TOL, match=False, first_divergence=0, distance=1.0, diverged=True),
    Row("tolerance: the reference class's own noise widens the allowance", out([1, 1], [SPLIT, SPLIT]),
        ref([1, 1], [SURE, SURE]), PLAIN, "tolerance", TOL, match=True, first_divergence=None, distance=0.5,
        diverged=False, noise=ConditionNoise(runs=3, diverged=0, max_distance=0.6)),
    Row("tolerance: ... but less noise than the tolerance does not narrow it", out([1, 1], [SPLIT, SPLIT]),
        ref([1, 1], [SURE, SURE]), PLAIN, "tolerance", TOL, match=True, first_divergence=None, distance=0.5,
        diverged=True, noise=ConditionNoise(runs=3, diverged=0, max_distance=0.1)),
    Row("tolerance: a failed expected answer diverges when required", out([1], [SURE], text="5"),
        ref([1], [SURE], expected_pass=True), WITH_EXPECTED, "tolerance", TOL, match=True, first_divergence=None,
        distance=0.0, diverged=True, expected_pass=False, answer_bad=True),
    Row("tolerance: ... and not when not required", out([1], [SURE], text="5"),
        ref([1], [SURE], expected_pass=True), WITH_EXPECTED, "tolerance", TOL_LAX, match=True,
        first_divergence=None, distance=0.0, diverged=False, expected_pass=False, answer_bad=True),
    Row("exact: the expected answer does not decide divergence", out([1], [SURE], text="5"),
        ref([1], [SURE], expected_pass=True), WITH_EXPECTED, "exact", TOL, match=True, first_divergence=None,
        distance=0.0, diverged=False, expected_pass=False, answer_bad=True),
    Row("a passing answer is not bad in the answer test", out([1], [SURE], text="4."),
        ref([1], [SURE], expected_pass=True), WITH_EXPECTED, "exact", TOL, match=True, first_divergence=None,
        distance=0.0, diverged=False, expected_pass=True, answer_bad=False),
    Row("a prompt the reference got wrong is left out of the answer test", out([1], [SURE], text="5"),
        ref([1], [SURE], expected_pass=False), WITH_EXPECTED, "exact", TOL, match=True, first_divergence=None,
        distance=0.0, diverged=False, expected_pass=False, answer_bad=None),
    Row("no expected answer: no answer test", out([1], [SURE], text="5"), ref([1], [SURE]), PLAIN, "exact", TOL,
        match=True, first_divergence=None, distance=0.0, diverged=False, expected_pass=None, answer_bad=None),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_score_probe(row: Row) -> None:
    score = score_probe(row.output, row.reference, row.prompt, row.mode, row.tolerance, row.noise)
    assert (score.match, score.first_divergence, score.diverged) == (row.match, row.first_divergence, row.diverged)
    assert score.distance == pytest.approx(row.distance)
    assert (score.expected_pass, score.answer_bad, score.mode) == (row.expected_pass, row.answer_bad, row.mode)


def test_tolerance_still_holds_a_class_to_its_own_answer_at_batch_1() -> None:
    """An approximate top-k sampler flips a near-tie at batch 4: the raw logprobs are unchanged (distance ~0)
    and the golden set's tolerance passes it, but the class answered differently at batch 1."""
    invariant = {1: ConditionNoise(runs=8, diverged=0), 4: ConditionNoise(runs=8, diverged=0)}
    reference = ref([1, 1], [SPLIT, SPLIT]).model_copy(update={"noise": invariant})
    at_b1 = score_probe(out([1, 1], [SPLIT, SPLIT]), reference, PLAIN, "tolerance", TOL_LAX)
    assert at_b1.batch_variant is None and not at_b1.diverged and at_b1.tokens_digest
    flipped = out([2, 1], [SPLIT, SPLIT])
    within_tolerance = score_probe(flipped, reference, PLAIN, "tolerance", TOL_LAX, condition=4)
    assert not within_tolerance.diverged and within_tolerance.batch_variant is None  # no batch-1 answer yet
    judged = score_probe(flipped, reference, PLAIN, "tolerance", TOL_LAX, condition=4,
                         batch1_digest=at_b1.tokens_digest)
    assert judged.batch_variant is True and judged.diverged and judged.distance < 0.3
    same = score_probe(out([1, 1], [SPLIT, SPLIT]), reference, PLAIN, "tolerance", TOL_LAX, condition=4,
                       batch1_digest=at_b1.tokens_digest)
    assert same.batch_variant is False and not same.diverged


@pytest.mark.parametrize("noise", [{4: ConditionNoise(runs=8, diverged=1)}, {1: ConditionNoise(runs=8, diverged=0)}],
                         ids=["the recording class varied at b4", "b4 not recorded"])
def test_batch_invariance_is_not_judged_where_the_reference_cannot_vouch_for_it(noise: dict) -> None:
    reference = ref([1, 1], [SPLIT, SPLIT]).model_copy(update={"noise": noise})
    b1 = score_probe(out([1, 1], [SPLIT, SPLIT]), reference, PLAIN, "tolerance", TOL_LAX).tokens_digest
    score = score_probe(out([2, 1], [SPLIT, SPLIT]), reference, PLAIN, "tolerance", TOL_LAX, condition=4,
                        batch1_digest=b1)
    assert score.batch_variant is None and not score.diverged


def test_exact_mode_does_not_need_the_batch_1_answer() -> None:
    reference = ref([1, 1], [SPLIT, SPLIT]).model_copy(update={"noise": {4: ConditionNoise(runs=8, diverged=0)}})
    score = score_probe(out([2, 1], [SPLIT, SPLIT]), reference, PLAIN, "exact", TOL, condition=4, batch1_digest="x")
    assert score.diverged and score.batch_variant is None
