"""Multi-turn agent sessions: each turn sends the whole history so far, the last answer and a tool result.

A session starts with a system prompt shared by every session (`system_blocks`) and a unique task; turn k's
prompt is turn k-1's prompt + the model's answer to it (`answer_blocks`) + a tool result (`tool_blocks`), so
each prompt extends the previous one. Sessions start as a Poisson process (`sessions_per_s`); a turn follows
the previous one after the answer (`output_tokens` at ~`decode_s_per_token`) and the tool's run time
(uniform in `tool_s`). Clients send no session id.
"""

from __future__ import annotations

import random

from benchmarks.workloads import HashIds, Row, row


def agent_sessions(seed: int = 0, *, sessions: int = 12, turns: tuple[int, int] = (3, 6), system_blocks: int = 4,
                   task_blocks: int = 2, answer_blocks: int = 1, tool_blocks: tuple[int, int] = (1, 3),
                   output_tokens: int = 24, sessions_per_s: float = 0.25, tool_s: tuple[float, float] = (1.0, 4.0),
                   decode_s_per_token: float = 0.05) -> list[Row]:
    rng = random.Random(seed)
    ids = HashIds()
    system = ids.take(system_blocks)
    rows: list[Row] = []
    start = 0.0
    for _ in range(sessions):
        start += rng.expovariate(sessions_per_s)
        history = system + ids.take(task_blocks)
        at = start
        for turn in range(rng.randint(*turns)):
            if turn:
                history = history + ids.take(answer_blocks) + ids.take(rng.randint(*tool_blocks))
            rows.append(row(at, history, output_tokens))
            at += output_tokens * decode_s_per_token + rng.uniform(*tool_s)
    return sorted(rows, key=lambda r: r["timestamp"])
