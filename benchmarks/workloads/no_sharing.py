"""Prompts that share nothing: every block unique, lengths uniform in `blocks`; Poisson arrivals at `rps`."""

from __future__ import annotations

import random

from benchmarks.workloads import HashIds, Row, row


def no_sharing(seed: int = 0, *, requests: int = 80, blocks: tuple[int, int] = (4, 16), output_tokens: int = 24,
               rps: float = 1.0) -> list[Row]:
    rng = random.Random(seed)
    ids = HashIds()
    rows: list[Row] = []
    at = 0.0
    for _ in range(requests):
        at += rng.expovariate(rps)
        rows.append(row(at, ids.take(rng.randint(*blocks)), output_tokens))
    return rows
