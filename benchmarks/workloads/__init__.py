"""Workload shapes for the routing benchmark and the simulator, in the Mooncake trace schema.

Each generator returns rows `{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids":
[int]}`, one 512-token block per hash id (as ../shared/traces/mooncake_*.jsonl: equal ids mean equal blocks, and
a prompt is its blocks in order), deterministic for a seed. benchmarks/routing.py maps each id to real tokens
(`--block-tokens` per id), so every router and `fleetctl sim` replay the same prompts.

Shapes (`SHAPES`):
- `agent`: multi-turn agent sessions; each turn re-sends the session's whole history plus the last answer and a
  tool result, so a session's prompts grow and each extends the previous one;
- `rag`: retrieval-augmented prompts over a shared pool of documents with Zipf popularity, the retrieved
  documents in varying order after a shared instruction, then a unique question;
- `system_prompt`: a few long shared system prompts (tenants) with short unique user turns;
- `no_sharing`: prompts that share nothing.

`reuse_ceiling` is each shape's oracle: the fraction of prompt blocks that an infinite cache with perfect
routing would serve (the leading run of a prompt's blocks that an earlier prompt already had).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

Row = dict[str, Any]
TRACE_BLOCK_TOKENS = 512  # the Mooncake schema's tokens per hash id


def row(timestamp_s: float, hash_ids: Sequence[int], output_length: int) -> Row:
    return {"timestamp": int(round(timestamp_s * 1000)), "input_length": len(hash_ids) * TRACE_BLOCK_TOKENS,
            "output_length": int(output_length), "hash_ids": list(hash_ids)}


def reuse_ceiling(rows: Iterable[Row]) -> float:
    """Blocks in leading runs already seen (a block is reusable only after every block before it), over all
    prompt blocks, in arrival order."""
    seen: set[tuple[int, ...]] = set()
    hit = total = 0
    for r in sorted(rows, key=lambda r: r["timestamp"]):
        ids = tuple(r["hash_ids"])
        total += len(ids)
        run = 0
        while run < len(ids) and ids[: run + 1] in seen:
            run += 1
        hit += run
        seen.update(ids[: k + 1] for k in range(len(ids)))
    return hit / total if total else 0.0


def write_jsonl(rows: Iterable[Row], path: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


class HashIds:
    """Fresh block ids, counted from `start`."""

    def __init__(self, start: int = 0):
        self.next = start

    def take(self, n: int) -> list[int]:
        ids = list(range(self.next, self.next + n))
        self.next += n
        return ids


def shapes() -> dict[str, Callable[..., list[Row]]]:
    from benchmarks.workloads.agent_sessions import agent_sessions
    from benchmarks.workloads.no_sharing import no_sharing
    from benchmarks.workloads.rag import rag
    from benchmarks.workloads.system_prompt import system_prompt

    return {"agent": agent_sessions, "rag": rag, "system_prompt": system_prompt, "no_sharing": no_sharing}


SHAPES = ("agent", "rag", "system_prompt", "no_sharing")
