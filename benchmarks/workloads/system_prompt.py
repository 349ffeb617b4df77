"""A few long shared system prompts (one per tenant, tenants by Zipf popularity) and short unique user turns;
Poisson arrivals at `rps`."""

from __future__ import annotations

import random

from benchmarks.workloads import HashIds, Row, row


def system_prompt(seed: int = 0, *, requests: int = 80, tenants: int = 3, system_blocks: int = 16,
                  user_blocks: tuple[int, int] = (1, 2), output_tokens: int = 24, rps: float = 1.0) -> list[Row]:
    rng = random.Random(seed)
    ids = HashIds()
    systems = [ids.take(system_blocks) for _ in range(tenants)]
    weights = [1.0 / (rank + 1) for rank in range(tenants)]
    rows: list[Row] = []
    at = 0.0
    for _ in range(requests):
        at += rng.expovariate(rps)
        tenant = rng.choices(range(tenants), weights)[0]
        rows.append(row(at, systems[tenant] + ids.take(rng.randint(*user_blocks)), output_tokens))
    return rows
