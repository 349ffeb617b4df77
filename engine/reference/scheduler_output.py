"""The one type between the scheduler and the model runner (as vLLM v1's SchedulerOutput)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.reference.sequence import Sequence


@dataclass
class ScheduledChunk:
    seq: Sequence
    # Tokens to compute this step: all_token_ids[start : start + num_new_tokens].
    # Their slots are already allocated in seq.block_table.
    num_new_tokens: int
    # seq.num_computed_tokens when the chunk was scheduled. A snapshot, not a property: the scheduler
    # advances seq.num_computed_tokens after the step, and the chunk must still describe what ran.
    start: int = -1

    def __post_init__(self) -> None:
        if self.start < 0:
            self.start = self.seq.num_computed_tokens

    @property
    def end(self) -> int:
        return self.start + self.num_new_tokens

    @property
    def samples(self) -> bool:
        """The step reaches the sequence's last known token, so its logits are sampled."""
        return self.end == self.seq.num_tokens


@dataclass
class ScheduledKVLoad:
    """Write externally supplied K/V for seq's tokens [start, end) into its blocks before this step's forward."""

    seq: Sequence
    start: int  # first token to load (tokens before it were prefix-cache hits)
    end: int


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)  # running decodes first, then prefill chunks
    preempted: list[Sequence] = field(default_factory=list)  # sent back to waiting; their blocks are freed
    kv_loads: list[ScheduledKVLoad] = field(default_factory=list)  # applied before the forward
    num_batched_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.chunks
