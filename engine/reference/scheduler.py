"""Iteration-level continuous batching with chunked prefill, prefix caching, P/D loads and preemption.

Each `schedule()` builds one step within `max_num_batched_tokens` (vLLM v1 / nano-vllm semantics):
1. Running sequences, FCFS. A decode needs 1 token; a sequence still in chunked prefill gets what the budget
   allows. If its slots cannot be allocated, the NEWEST running sequence is preempted (blocks freed, sent to
   the front of waiting to be recomputed) and the allocation retried; if it is itself the newest, it goes.
2. Waiting sequences, FCFS, while there is budget and fewer than `max_num_seqs` run, and no sequence was
   preempted this step (so a victim is not readmitted at once). First the prefix-cache lookup, then P/D
   loads (tokens whose K/V arrives from a prefill engine count as computed and use no budget), then the
   prefill chunk. The head of waiting that cannot get blocks stops admission: no skipping.
3. `output.chunks` lists decodes first, then prefill chunks.

Invariants:
- A sequence is in exactly one of `waiting` (holding no blocks) or `running`, or it is finished and gone.
- After `schedule()`, each scheduled sequence's block table covers positions up to its chunk's end.
- Preemption never takes a sequence already scheduled this step, so the output is always consistent.
- With chunked prefill off a prompt is never split: it runs whole if it fits the remaining budget, or if no
  other prefill was scheduled this step (a prompt longer than the budget runs alone, stalling that step).

The engine's loop: `schedule()` -> forward -> `update_after_step(output)` (returns the sequences to sample
from) -> `seq.append_token` -> stop checks -> `finish(...)`. After each step it reads `stats()` (gauges) and
`take_step_stats()` (preemptions and prefix-cache queries/hits since the previous call).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from engine.errors import ContextLengthExceeded
from engine.reference.block_manager import BlockManager, cdiv
from engine.reference.config import EngineConfig
from engine.contract.outputs import SchedulerStats
from engine.reference.scheduler_output import ScheduledChunk, ScheduledKVLoad, SchedulerOutput
from engine.reference.sequence import Sequence, SequenceStatus


@dataclass
class StepStats:
    """Events counted since the previous `take_step_stats()`; the engine adds them to IterationStats."""

    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # tokens of admitted sequences looked up in the prefix cache
    # tokens of admitted sequences whose K/V a prefill engine sends (P/D), and of them those it supplies
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    prefix_cache_hits: int = 0  # of which found


@dataclass
class _Step:
    """What one schedule() call has decided so far."""

    output: SchedulerOutput
    budget: int
    decodes: list[ScheduledChunk]
    prefills: list[ScheduledChunk]

    @property
    def prefill_scheduled(self) -> bool:
        return bool(self.prefills)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last one is the newest
        self._requests: dict[str, Sequence] = {}  # every unfinished sequence, waiting or running
        self._step_stats = StepStats()

    # ----- requests -----

    def add(self, seq: Sequence) -> None:
        if seq.request_id in self._requests:
            raise ValueError(f"request {seq.request_id!r} is already scheduled")
        self._check_fits(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self._requests[seq.request_id] = seq

    def _check_fits(self, seq: Sequence) -> None:
        """Guard only (the engine validates first): a prompt that can never run would block the queue forever."""
        if seq.num_tokens == 0:
            raise ValueError(f"request {seq.request_id!r} has no tokens")
        if seq.num_tokens > self.config.max_model_len:
            raise ContextLengthExceeded(
                f"{seq.num_tokens} tokens exceed the context window of {self.config.max_model_len}", "prompt"
            )
        num_blocks = cdiv(seq.num_tokens, self.block_manager.block_size)
        if num_blocks > self.block_manager.num_blocks:
            raise ContextLengthExceeded(
                f"{seq.num_tokens} tokens need {num_blocks} KV blocks; the pool has {self.block_manager.num_blocks}",
                "prompt",
            )

    def get(self, request_id: str) -> Sequence | None:
        return self._requests.get(request_id)

    def abort(self, request_id: str) -> Sequence | None:
        """Remove an unfinished request, free its blocks; None if it is unknown or already finished."""
        seq = self._requests.get(request_id)
        if seq is not None:
            self.finish(seq, SequenceStatus.FINISHED_ABORTED)
        return seq

    def finish(self, seq: Sequence, status: SequenceStatus, free_blocks: bool = True) -> None:
        """Take seq out of the queues. free_blocks=False keeps its blocks (P/D prefill side, until transfer);
        the engine then calls block_manager.free(seq) itself."""
        assert status.is_finished
        self._requests.pop(seq.request_id, None)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = status
        if free_blocks:
            self.block_manager.free(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # ----- stats -----

    def stats(self) -> SchedulerStats:
        bm = self.block_manager
        return SchedulerStats(
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            kv_cache_usage=bm.usage,
            num_blocks=bm.num_blocks,
            num_free_blocks=bm.num_free_blocks,
        )

    def take_step_stats(self) -> StepStats:
        stats, self._step_stats = self._step_stats, StepStats()
        return stats

    # ----- one step -----

    def schedule(self) -> SchedulerOutput:
        step = _Step(SchedulerOutput(), self.config.max_num_batched_tokens, [], [])
        self._schedule_running(step)
        if not step.output.preempted:
            self._schedule_waiting(step)
        step.output.chunks = step.decodes + step.prefills
        step.output.num_batched_tokens = sum(chunk.num_new_tokens for chunk in step.output.chunks)
        return step.output

    def _schedule_running(self, step: _Step) -> None:
        index = 0
        while index < len(self.running) and step.budget > 0:
            seq = self.running[index]
            num_new = self._num_new_tokens(seq.num_tokens - seq.num_computed_tokens, step)
            if num_new > 0 and self._allocate_or_preempt(seq, num_new, step.output):
                self._add_chunk(step, ScheduledChunk(seq, num_new))
            if seq.status is SequenceStatus.RUNNING:  # else it preempted itself and left the list
                index += 1

    def _allocate_or_preempt(self, seq: Sequence, num_new: int, output: SchedulerOutput) -> bool:
        """Allocate seq's slots, preempting the newest running sequences until it fits or seq itself goes."""
        while not self.block_manager.allocate_slots(seq, num_new):
            victim = self.running.pop()
            self._preempt(victim, output)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, output: SchedulerOutput) -> None:
        """Send seq (already taken out of running) back to the front of waiting, to be recomputed."""
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.external_kv_tokens = 0  # the loaded K/V is gone with the blocks: recompute
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        output.preempted.append(seq)
        self._step_stats.num_preemptions += 1

    def _schedule_waiting(self, step: _Step) -> None:
        while self.waiting and step.budget > 0 and len(self.running) < self.config.max_num_seqs:
            if not self._admit(self.waiting[0], step):
                return
            seq = self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)

    def _admit(self, seq: Sequence, step: _Step) -> bool:
        """Prefix lookup, P/D load and first chunk for the head of waiting; False (nothing changed) if it
        does not fit the budget or the pool."""
        bm = self.block_manager
        computed_blocks, num_hit = bm.get_computed_blocks(seq)
        if seq.external_kv_first_block * bm.block_size > num_hit:
            # K/V fetched from a tier to follow blocks the cache held then, and has lost since: a gap. Recompute.
            seq.external_kv_tokens = 0
        load_end = max(num_hit, min(seq.external_kv_tokens, seq.num_tokens - 1))
        num_new = self._num_new_tokens(seq.num_tokens - load_end, step)
        if num_new == 0 or not bm.allocate_slots(seq, load_end - num_hit + num_new, computed_blocks):
            return False
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = time.monotonic()
            seq.num_cached_tokens = num_hit
            seq.num_external_tokens = load_end - num_hit
            seq.num_recomputed_tokens = bm.cached_but_recomputed(seq, num_hit)
        if seq.external_kv_tokens > 0:
            self._step_stats.external_prefix_cache_queries += seq.num_tokens
            self._step_stats.external_prefix_cache_hits += load_end - num_hit
        if load_end > num_hit:
            step.output.kv_loads.append(ScheduledKVLoad(seq, start=num_hit, end=load_end))
        seq.num_computed_tokens = load_end
        self._step_stats.prefix_cache_queries += seq.num_tokens if bm.enable_prefix_caching else 0
        self._step_stats.prefix_cache_hits += num_hit
        self._add_chunk(step, ScheduledChunk(seq, num_new))
        return True

    def _num_new_tokens(self, num_remaining: int, step: _Step) -> int:
        """Tokens to compute for a sequence with num_remaining uncomputed tokens; 0 = not this step."""
        if num_remaining <= step.budget:
            return num_remaining
        if self.config.enable_chunked_prefill:
            return step.budget
        return 0 if step.prefill_scheduled else num_remaining

    def _add_chunk(self, step: _Step, chunk: ScheduledChunk) -> None:
        seq = chunk.seq
        is_decode = chunk.num_new_tokens == 1 and seq.num_computed_tokens >= seq.num_prompt_tokens
        (step.decodes if is_decode else step.prefills).append(chunk)
        step.budget = max(0, step.budget - chunk.num_new_tokens)

    def update_after_step(self, output: SchedulerOutput) -> list[Sequence]:
        """Advance each scheduled sequence past its chunk and cache its newly full blocks.

        Returns the sequences whose chunk reached their last known token (chunk.samples): the engine samples
        one token for each and appends it. Sequences aborted since schedule() are skipped.
        """
        to_sample: list[Sequence] = []
        for chunk in output.chunks:
            seq = chunk.seq
            if seq.status is not SequenceStatus.RUNNING:
                continue
            if chunk.samples:
                to_sample.append(seq)
            seq.num_computed_tokens += chunk.num_new_tokens
            self.block_manager.cache_full_blocks(seq)
        return to_sample
