"""Comparing two answers to the same golden prompt: where their tokens part, how far apart their top-k
logprob distributions are, and whether an answer contains the expected one. Pure, torch-free."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from fleetctl.canary.types import Expected, TopLogprobs


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where the token sequences differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def position_distance(a: TopLogprobs, b: TopLogprobs) -> float:
    """Total variation between two top-k distributions at one position, each renormalised over its own
    top-k (tokens outside a list have probability 0 in it). 0 = identical, 1 = disjoint."""
    pa, pb = _normalised(a), _normalised(b)
    return 0.5 * sum(abs(pa.get(t, 0.0) - pb.get(t, 0.0)) for t in pa.keys() | pb.keys())


def topk_distance(a: Sequence[TopLogprobs], b: Sequence[TopLogprobs], upto: int | None = None) -> float:
    """Mean position_distance over the first `upto` positions both have (the matching prefix: past the
    first divergence the contexts differ, so the distributions are not comparable). 0.0 when there are none."""
    n = min(len(a), len(b)) if upto is None else min(upto, len(a), len(b))
    if n == 0:
        return 0.0
    return sum(position_distance(a[i], b[i]) for i in range(n)) / n


def expected_passes(text: str, expected: Expected) -> bool:
    """exact: the stripped answer equals it, or starts with it followed by a non-word character (an
    instruct model adds a full stop); regex: re.search finds it anywhere."""
    if expected.regex is not None:
        return re.search(expected.regex, text) is not None
    want, got = (expected.exact or "").strip(), text.strip()
    return got == want or (got.startswith(want) and not got[len(want):len(want) + 1].isalnum())


def _normalised(top: TopLogprobs) -> dict[int, float]:
    probs = {int(t): math.exp(lp) for t, lp in top if math.isfinite(lp)}
    total = sum(probs.values())
    return {t: p / total for t, p in probs.items()} if total > 0 else {}
