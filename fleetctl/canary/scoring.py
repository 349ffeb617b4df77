"""One probe's answer against its reference: did the greedy tokens match, where did they part, how far apart
are the top-k distributions, did the expected answer pass, and does the probe count as bad. Pure.

Two modes (the reference's `canary_refs.reference_for` says which):
- exact: the reference came from a class with the same correctness fields, so any token difference is a
  divergence, and so is a top-k distance above `noise_margin` x the recording class's own largest distance at
  that batch condition (never below `distance_floor`): a reduced-precision KV cache moves the logprobs
  without flipping a greedy token. Token flips from batch noise are not forgiven here: the stream's p0
  (noise.py) accounts for them.
- tolerance: the reference came from a correctness-different class (a long-context build). Its tokens may
  differ; the probe diverges only when its distributions are further from the reference's than the golden
  set's `tolerance.max_distance` (or than the reference class's own run-to-run distance at that batch
  condition, whichever is larger), or, with `require_expected`, when its expected answer fails.

Tolerance mode still holds a class to batch invariance: a probe served at a batch condition above 1 is
compared with the class's own latest answer to the prompt at batch 1 (`batch1_digest`, when there is one), and
differs "by batch" when the tokens are not the same while the recording class's were at that condition (its
recorded noise there: no run diverged). Greedy answers that change with the batch are wrong whatever the
reference, and the golden set's tolerance cannot see them: an approximate top-k sampler flips near-ties at
large batches, where the distance is ~0 (the raw logprobs are unchanged) and the expected answer may pass.

The distance covers the matching prefix and the first diverging position: the distribution there is still
conditioned on the same tokens, so it is comparable (and is where a wrong token shows first); past it the
contexts differ.

The answer test is separate: a prompt takes part only when it has an expected answer that the reference's
own answer passed (a prompt the known-good class gets wrong says nothing about the class under test).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from fleetctl.canary.distance import expected_passes, first_divergence, topk_distance
from fleetctl.canary.types import CompareMode, ConditionNoise, GoldenPrompt, ProbeOutput, PromptReference, Score, Tolerance


def score_probe(output: ProbeOutput, ref: PromptReference, prompt: GoldenPrompt, mode: CompareMode,
                tolerance: Tolerance, noise: ConditionNoise | None = None, *, noise_margin: float = 4.0,
                distance_floor: float = 2e-5, condition: int = 1, batch1_digest: str | None = None) -> Score:
    divergence = first_divergence(ref.tokens, output.tokens)
    compared = None if divergence is None else divergence + 1
    distance = topk_distance(ref.top_logprobs, output.top_logprobs, upto=compared)
    expected_pass = expected_passes(output.text, prompt.expected) if prompt.expected is not None else None
    digest = tokens_digest(output.tokens)
    batch_variant = None
    if mode == "exact":
        allowed = max(distance_floor, noise_margin * (noise.max_distance if noise is not None else 0.0))
        diverged = divergence is not None or distance > allowed
    else:
        allowed = max(tolerance.max_distance, noise.max_distance if noise is not None else 0.0)
        batch_variant = differs_by_batch(digest, condition, batch1_digest, ref.noise.get(condition))
        diverged = distance > allowed or (tolerance.require_expected and expected_pass is False) or bool(batch_variant)
    answer_bad = (not expected_pass) if expected_pass is not None and ref.expected_pass is True else None
    return Score(match=divergence is None, first_divergence=divergence, expected_pass=expected_pass,
                 distance=distance, diverged=diverged, answer_bad=answer_bad, mode=mode, tokens_digest=digest,
                 batch_variant=batch_variant)


def differs_by_batch(digest: str, condition: int, batch1_digest: str | None,
                     recorded: ConditionNoise | None) -> bool | None:
    """True when the answer at `condition` is not the class's own at batch 1 although the recording class's
    answers did not change at that condition (`recorded`: its noise there); None when that cannot be judged
    (batch 1, no batch-1 answer yet, the condition not recorded, or the recording class itself varied there)."""
    if condition <= 1 or batch1_digest is None or recorded is None or recorded.runs == 0 or recorded.diverged > 0:
        return None
    return digest != batch1_digest


def tokens_digest(tokens: Sequence[int]) -> str:
    """A short digest of an answer's token ids (what a later probe compares its own answer with)."""
    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()[:16]
