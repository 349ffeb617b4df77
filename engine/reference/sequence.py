"""One request as the scheduler and model runner see it: tokens, block table, progress, timings.

Invariants:
- `num_computed_tokens` tokens of `all_token_ids` have their K/V written in the blocks of `block_table`.
- `block_table[i]` holds positions [i*block_size, (i+1)*block_size).
- A sequence is sampled from only when a step computes up to its last known token.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from engine.contract.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"  # EOS, a stop token or a stop string
    FINISHED_LENGTH_CAPPED = "length"  # max_tokens or the context window
    FINISHED_ABORTED = "abort"  # client went away, or the engine aborted it

    @property
    def is_finished(self) -> bool:
        return self in (
            SequenceStatus.FINISHED_STOPPED,
            SequenceStatus.FINISHED_LENGTH_CAPPED,
            SequenceStatus.FINISHED_ABORTED,
        )


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # Prompt tokens found in the prefix cache when this sequence was first scheduled (for usage and metrics).
    num_cached_tokens: int = 0
    # Of the prompt, at first schedule: tokens whose K/V came from a P/D transfer (vllm:prompt_tokens_by_source
    # external_kv_transfer), and tokens the cache held but that were computed again (the last block of a prompt
    # the cache held whole: at least one token is computed, for logits).
    num_external_tokens: int = 0
    num_recomputed_tokens: int = 0
    num_preemptions: int = 0
    # P/D decode side: leading prompt tokens whose K/V arrives from a prefill engine instead of being computed.
    # The scheduler allocates their blocks at first schedule and lists them in SchedulerOutput.kv_loads;
    # a preemption resets this to 0 (the loaded K/V is gone, so the prompt is recomputed).
    external_kv_tokens: int = 0
    # KV tier side: the external K/V starts at this logical block (the engine's own cache held the blocks before
    # it when the tier was asked); it is used only if the engine still holds them at first schedule.
    external_kv_first_block: int = 0
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    # The smallest and largest number of sequences sampled in the steps that produced its tokens (batch size
    # is a correctness variable: a sampler can be wrong only at some sizes). None before its first token.
    batch_size_min: int | None = None
    batch_size_max: int | None = None
    # Timings (time.monotonic()), for vLLM's latency histograms.
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def is_prefill(self) -> bool:
        """True while the prompt has tokens whose K/V is not computed yet."""
        return self.num_computed_tokens < self.num_prompt_tokens

    def note_batch_size(self, size: int) -> None:
        self.batch_size_min = size if self.batch_size_min is None else min(self.batch_size_min, size)
        self.batch_size_max = size if self.batch_size_max is None else max(self.batch_size_max, size)

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
