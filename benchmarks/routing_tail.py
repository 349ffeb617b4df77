"""Why the gateway's slowest requests were slow: each request in a run's tail (TTFT at or above the run's P90)
gets one cause, from the gateway's own decision for it (`route explain`'s candidates, asked just before the
request was sent: what each engine held of the prompt and the load the scorer saw) and the workload itself
(which earlier prompt this one extends, and where that one was served).

Causes, the first that applies:
- `passed_over_hot_spot`: an engine held more of the prompt than the chosen one, and the hot-spot guard
  ignored its cache;
- `passed_over_load`: an engine held more of the prompt, and the score preferred the chosen one's lower load;
- `session_break`: the prompt extends an earlier one (an agent's previous turn) that another engine served,
  and the chosen engine did not hold it, nor did the index show any engine holding more (its blocks not yet
  announced, or evicted);
- `queued`: the chosen engine had requests waiting, or more prompt tokens queued for prefill than this
  prompt's own uncached part;
- `cold_prefix`: nothing earlier had this prompt's leading blocks: a cold prefill wherever it went;
- `other`: none of these (e.g. decode steps of other requests slowed the prefill).

Pure: data in, counts out; tested in tests/benchmarks/test_routing_tail.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

CAUSES = ("passed_over_hot_spot", "passed_over_load", "session_break", "queued", "cold_prefix", "other")


@dataclass(frozen=True)
class Decision:
    """One request as the tail analysis sees it."""

    ids: Sequence[int]  # the prompt's token ids
    ttft_s: float
    served_by: str
    candidates: Sequence[dict[str, Any]]  # route explain's rows: engine, cached_blocks, hot_spot_damped, load
    block: int = 16


@dataclass
class TailReport:
    p90_s: float
    requests: int = 0
    causes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    ttft_by_cause: dict[str, float] = field(default_factory=dict)  # mean TTFT of the tail requests of each cause
    examples: dict[str, list[int]] = field(default_factory=dict)  # request positions, a few per cause


def predecessor(prompts: Sequence[Sequence[int]], position: int) -> int | None:
    """The latest earlier prompt that this one strictly extends (an agent session's previous turn), if any."""
    prompt = prompts[position]
    for earlier in range(position - 1, -1, -1):
        other = prompts[earlier]
        if len(other) < len(prompt) and list(prompt[: len(other)]) == list(other):
            return earlier
    return None


def leading_seen(prompt: Sequence[int], seen: set[tuple[int, ...]], block: int) -> int:
    """Leading blocks of `prompt` that an earlier prompt had (the oracle's hit)."""
    blocks = 0
    while blocks < (len(prompt) - 1) // block and tuple(prompt[: (blocks + 1) * block]) in seen:
        blocks += 1
    return blocks


def cause_of(decision: Decision, oracle_blocks: int, previous_engine: str | None, previous_blocks: int = 0) -> str:
    """`previous_engine`, `previous_blocks`: where the prompt this one extends was served, and its full blocks."""
    rows = list(decision.candidates)
    chosen = next((c for c in rows if c["engine"] == decision.served_by), rows[0] if rows else None)
    if chosen is None:
        return "other"
    richer = [c for c in rows if c["cached_blocks"] > chosen["cached_blocks"]]
    if any(c.get("hot_spot_damped") for c in richer):
        return "passed_over_hot_spot"
    if richer:
        return "passed_over_load"
    if previous_engine is not None and previous_engine != decision.served_by and chosen["cached_blocks"] < previous_blocks:
        return "session_break"
    uncached = max(0, len(decision.ids) - chosen["cached_blocks"] * decision.block)
    if chosen.get("num_waiting", 0) > 0 or chosen.get("queued_prefill_tokens", 0) > uncached:
        return "queued"
    if oracle_blocks == 0:
        return "cold_prefix"
    return "other"


def tail_causes(decisions: Sequence[Decision], p90_s: float, examples_per_cause: int = 5) -> TailReport:
    """The cause of each request whose TTFT is at or above `p90_s` (requests in arrival order)."""
    report = TailReport(p90_s)
    prompts = [d.ids for d in decisions]
    seen: set[tuple[int, ...]] = set()
    ttft_sum: dict[str, float] = {}
    for position, decision in enumerate(decisions):
        oracle = leading_seen(decision.ids, seen, decision.block)
        seen.update(tuple(decision.ids[: (b + 1) * decision.block]) for b in range(len(decision.ids) // decision.block))
        if decision.ttft_s != decision.ttft_s or decision.ttft_s < p90_s:  # NaN (failed) or not in the tail
            continue
        before = predecessor(prompts, position)
        previous = decisions[before] if before is not None else None
        cause = cause_of(decision, oracle, previous.served_by if previous else None,
                         len(previous.ids) // previous.block if previous else 0)
        report.requests += 1
        report.causes[cause] += 1
        ttft_sum[cause] = ttft_sum.get(cause, 0.0) + decision.ttft_s
        report.examples.setdefault(cause, [])
        if len(report.examples[cause]) < examples_per_cause:
            report.examples[cause].append(position)
    report.ttft_by_cause = {c: ttft_sum[c] / report.causes[c] for c in ttft_sum}
    return report
