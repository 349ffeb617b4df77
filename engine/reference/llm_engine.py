"""The engine core: one `step()` = schedule, load external K/V, run the model, sample, apply stop rules.

Single-threaded by design: every method runs on the engine thread (`AsyncEngine` owns that thread).
P/D hooks:
- decode side: `add_request(..., external_kv=..., external_kv_tokens=n)`; the scheduler lists the load in
  SchedulerOutput.kv_loads and the K/V is written into the sequence's blocks before the forward.
- prefill side: `hold_blocks=True` keeps the blocks after the request finishes so a decode engine can pull
  them (released by `release_held`, or after `kv_transfer_timeout_s`); `kv_push` receives each block as soon
  as it is computed (our push extension).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.contract.faults import Fault
from engine.errors import ContextLengthExceeded, InvalidRequest
from engine.reference.block_manager import BlockManager
from engine.reference.config import EngineConfig
from engine.reference.kv_sinks import KVPushSink, KVTierSink
from engine.reference.model_runner import ModelRunner
from engine.reference.output_processor import OutputProcessor
from engine.reference.planted_fault import numeric_config
from engine.contract.outputs import (
    FinishedRequestStats,
    IterationStats,
    RequestOutput,
    SchedulerStats,
    StepResult,
)
from engine.reference.sampler import Sampler
from engine.contract.sampling_params import SamplingParams
from engine.reference.scheduler import Scheduler
from engine.reference.scheduler_output import SchedulerOutput
from engine.reference.sequence import Sequence, SequenceStatus
from engine.reference.weights import load_model_bundle

log = logging.getLogger(__name__)


@dataclass
class _HeldBlocks:
    seq: Sequence
    expires_at: float


class LLMEngine:
    def __init__(self, config: EngineConfig, *, sleep: Callable[[float], None] = time.sleep,
                 fault: Fault | None = None):
        """`sleep` is what `debug_step_delay_ms` waits with (tests pass a fake one). `fault`: a planted fault
        (engine.reference.planted_fault): the runner and sampler compute with `numeric_config`, while
        `config` stays what the engine was configured with and reports."""
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.config = config
        self.fault = fault
        self._sleep = sleep
        bundle = load_model_bundle(config)
        self.numeric_config = numeric_config(config, fault, bundle.hparams)
        self.tokenizer = bundle.tokenizer
        self.eos_token_id = bundle.eos_token_id
        self.runner = ModelRunner(self.numeric_config, bundle)
        self.block_manager = BlockManager(
            self.runner.num_blocks, config.block_size, config.enable_prefix_caching, config.hash_seed
        )
        self.scheduler = Scheduler(config, self.block_manager)
        self.sampler = Sampler(self.numeric_config.sampler, eos_token_id=bundle.eos_token_id)
        self.outputs = OutputProcessor(self.tokenizer, self.eos_token_id, config.max_model_len)
        self._external_kv: dict[str, torch.Tensor] = {}
        self._push_sinks: dict[str, KVPushSink] = {}
        self._pushed_blocks: dict[str, int] = {}
        self._hold: set[str] = set()
        self._held: dict[str, _HeldBlocks] = {}
        # Requests that finished outside a step (aborts), reported with the next stats.
        self._pending_finished: list[FinishedRequestStats] = []
        self._tier_sink: KVTierSink | None = None

    def set_tier_sink(self, sink: KVTierSink | None) -> None:
        """Offload evicted blocks to `sink` from now on (None: stop)."""
        self._tier_sink = sink
        self.block_manager.record_evictions = sink is not None and self.config.enable_prefix_caching

    # --- requests -------------------------------------------------------------------------------------

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise an InvalidRequest naming the field if the request can never run."""
        limit = self.config.max_model_len
        if not prompt_token_ids:
            raise InvalidRequest("the prompt is empty", param="prompt")
        if len(prompt_token_ids) >= limit:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {limit} tokens. However, your prompt has "
                f"{len(prompt_token_ids)} tokens; it must leave room for at least one output token.",
                param="prompt",
            )
        if len(prompt_token_ids) + params.max_tokens > limit:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt_token_ids) + params.max_tokens} tokens ({len(prompt_token_ids)} in the prompt, "
                f"{params.max_tokens} in the completion). Please reduce max_tokens or the prompt.",
                param="max_tokens",
            )
        vocab = self.runner.vocab_size
        if any(t < 0 or t >= vocab for t in prompt_token_ids):
            raise InvalidRequest(f"prompt token ids must be in [0, {vocab})", param="prompt")
        if len(prompt_token_ids) > self._max_schedulable_tokens():
            raise ContextLengthExceeded(
                f"the prompt ({len(prompt_token_ids)} tokens) needs more KV blocks than this engine's whole cache "
                f"holds ({self._max_schedulable_tokens()} tokens)", param="prompt"
            )

    def _max_schedulable_tokens(self) -> int:
        return self.runner.num_blocks * self.config.block_size

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        external_kv: torch.Tensor | None = None,
        external_kv_tokens: int = 0,
        external_kv_first_block: int = 0,
        hold_blocks: bool = False,
        kv_push: KVPushSink | None = None,
    ) -> None:
        self.validate(prompt_token_ids, params)
        seq = Sequence(request_id=request_id, prompt_token_ids=list(prompt_token_ids), params=params)
        if external_kv is not None and external_kv_tokens > 0:
            # The decode engine always computes the last prompt token itself, so it has logits to sample.
            seq.external_kv_tokens = min(external_kv_tokens, len(prompt_token_ids) - 1)
            seq.external_kv_first_block = external_kv_first_block
            self._external_kv[request_id] = external_kv
        if hold_blocks:
            self._hold.add(request_id)
        if kv_push is not None:
            self._push_sinks[request_id] = kv_push
            self._pushed_blocks[request_id] = 0
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        seq = self.scheduler.abort(request_id)
        self._forget(request_id)
        if seq is None:
            return None
        seq.finished_time = time.monotonic()
        self._pending_finished.append(self._finished_stats(seq, SequenceStatus.FINISHED_ABORTED))
        return RequestOutput(
            request_id, [], "", None, finished=True, finish_reason="abort",
            num_prompt_tokens=seq.num_prompt_tokens, num_output_tokens=seq.num_output_tokens,
            batch_size_min=seq.batch_size_min, batch_size_max=seq.batch_size_max,
        )

    def has_work(self) -> bool:
        return self.scheduler.has_unfinished()

    # --- P/D prefill side -----------------------------------------------------------------------------

    def export_kv(self, block_ids: list[int]) -> torch.Tensor:
        return self.runner.export_kv(block_ids)

    def pull_held(self, request_id: str, block_ids: list[int], out: torch.Tensor | None = None,
                  release: bool = True) -> torch.Tensor:
        """Export blocks held for request_id and release the hold, in one engine-thread step, so a late pull
        can never read blocks that were freed and reused by another request. With `out` (a CPU tensor
        [layers, 2, n, block_size, Hkv, D] in the KV dtype: the frame being sent) the blocks are gathered
        straight into it. `release=False` (a frame prepared before the pull) keeps holding them."""
        held = self._held.get(request_id)
        if held is None:
            raise InvalidRequest(f"no K/V held for request {request_id} (expired or already pulled)", param="request_id")
        foreign = [b for b in block_ids if b not in held.seq.block_table]
        if foreign:
            raise InvalidRequest(f"blocks {foreign[:8]} are not held for request {request_id}", param="block_ids")
        kv = self.runner.export_kv(block_ids) if out is None else self._export_into(block_ids, out)
        if release:
            self.release_held(request_id)
        return kv

    def _export_into(self, block_ids: list[int], out: torch.Tensor) -> torch.Tensor:
        """runner.export_kv into a given tensor, with no temporary. On CPU a plain byte copy per run of
        consecutive blocks, on this thread only: a transfer's socket threads need the other cores, and torch's
        parallel gather stalls whenever a core is busy (~5x slower at the median on a loaded 2-core box)."""
        cache = self.runner.kv
        layers, two, num_blocks = cache.shape[:3]
        shape = (layers, two, len(block_ids), *cache.shape[3:])
        if tuple(out.shape) != shape or out.dtype != cache.dtype or not out.is_contiguous():
            raise ValueError(f"export buffer {tuple(out.shape)} {out.dtype} does not fit {shape} {cache.dtype}")
        if not block_ids:
            return out
        if cache.device != out.device or out.device.type != "cpu":
            out.copy_(cache.index_select(2, torch.tensor(block_ids, dtype=torch.int64, device=cache.device)))
            return out
        src = cache.view(torch.uint8).reshape(layers * two, num_blocks, -1).numpy()  # [L*2, N, block bytes]
        dst = out.view(torch.uint8).reshape(layers * two, len(block_ids), -1).numpy()
        position = 0
        for first, count in _runs(block_ids):
            dst[:, position : position + count] = src[:, first : first + count]
            position += count
        return out

    def take_pending_finished(self) -> list[FinishedRequestStats]:
        pending, self._pending_finished = self._pending_finished, []
        return pending

    def release_held(self, request_id: str) -> bool:
        held = self._held.pop(request_id, None)
        if held is None:
            return False
        self.block_manager.free(held.seq)
        return True

    def release_expired(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        expired = [rid for rid, held in self._held.items() if held.expires_at <= now]
        for rid in expired:
            log.warning("releasing KV blocks of %s: no decode engine pulled them in time", rid)
            self.release_held(rid)
        return len(expired)

    # --- the step ------------------------------------------------------------------------------------

    def step(self) -> StepResult:
        self.release_expired()
        plan = self.scheduler.schedule()
        stats = IterationStats()
        self._offload_evicted()  # before anything writes into the blocks the schedule reused
        self._apply_kv_loads(plan)
        logits = self.runner.execute(plan) if plan.chunks else None
        self._debug_delay(plan)
        self.scheduler.update_after_step(plan)
        outputs = self._sample_and_process(plan, logits, stats) if logits is not None else []
        self._push_computed_blocks(plan)
        self._collect_scheduler_counters(plan, stats)
        stats.finished.extend(self.take_pending_finished())
        return StepResult(
            outputs=outputs,
            iteration=stats,
            scheduler=self.scheduler_stats(),
            kv_events=self.block_manager.take_events(),
        )

    def _debug_delay(self, plan: SchedulerOutput) -> None:
        """Test only: make a step that computed tokens last `debug_step_delay_ms` longer (before sampling, so
        the delay shows in TTFT and inter-token latency alike); the tokens are untouched."""
        if self.config.debug_step_delay_ms and plan.chunks:
            self._sleep(self.config.debug_step_delay_ms / 1000)

    def _offload_evicted(self) -> None:
        """Hand the blocks this schedule evicted to the tier sink: one copy of their K/V, on this thread (a
        memcpy); the sink sends it from its own. Blocks it has no room for are skipped before the copy."""
        evicted = self.block_manager.take_evicted()
        if not evicted or self._tier_sink is None:
            return
        taken = evicted[: self._tier_sink.room()]
        if len(taken) < len(evicted):
            self._tier_sink.skipped(len(evicted) - len(taken))
        if taken:
            self._tier_sink.offer(taken, self.runner.export_kv([b.block_id for b in taken]))

    def _apply_kv_loads(self, plan: SchedulerOutput) -> None:
        bs = self.config.block_size
        for load in plan.kv_loads:
            kv = self._external_kv.pop(load.seq.request_id, None)
            if kv is None:
                continue
            offset = load.seq.external_kv_first_block  # kv's first block is this logical block (tiers; 0 for P/D)
            first, last = load.start // bs, math.ceil(load.end / bs)
            last = min(last, offset + kv.shape[2])
            if last > first:
                self.runner.import_kv(load.seq.block_table[first:last], kv[:, :, first - offset : last - offset])

    def _sample_and_process(self, plan: SchedulerOutput, logits: torch.Tensor, stats: IterationStats) -> list[RequestOutput]:
        sampled_seqs = [chunk.seq for chunk in plan.chunks if chunk.samples]
        results = self.sampler.sample(logits, sampled_seqs)
        now = time.monotonic()
        outputs = []
        for seq, result in zip(sampled_seqs, results):
            self._record_token_timing(seq, now, stats)
            seq.note_batch_size(len(sampled_seqs))  # the running batch the sampler saw for this token
            seq.append_token(result.token_id)
            text, status = self.outputs.process_token(seq)
            output = RequestOutput(
                request_id=seq.request_id,
                new_token_ids=[result.token_id],
                new_text=text,
                new_logprobs=[result.logprob] if result.logprob is not None else None,
                num_prompt_tokens=seq.num_prompt_tokens,
                num_output_tokens=seq.num_output_tokens,
                num_cached_tokens=seq.num_cached_tokens,
                batch_size_min=seq.batch_size_min,
                batch_size_max=seq.batch_size_max,
            )
            if status is not None:
                self._finish(seq, status, output, now, stats)
            outputs.append(output)
        stats.num_generation_tokens = len(sampled_seqs)
        return outputs

    def _record_token_timing(self, seq: Sequence, now: float, stats: IterationStats) -> None:
        if seq.first_token_time is None:
            seq.first_token_time = now
            stats.time_to_first_tokens.append(now - seq.arrival_time)
            stats.prompt_lengths_first_token.append(seq.num_prompt_tokens)
            self._record_prompt_sources(seq, stats)
        else:
            stats.inter_token_latencies.append(now - seq.last_token_time)
        seq.last_token_time = now

    @staticmethod
    def _record_prompt_sources(seq: Sequence, stats: IterationStats) -> None:
        cached = min(seq.num_cached_tokens, seq.num_prompt_tokens)
        external = min(seq.num_external_tokens, seq.num_prompt_tokens - cached)
        stats.prompt_tokens_local_cache_hit += cached
        stats.prompt_tokens_external += external
        stats.prompt_tokens_local_compute += seq.num_prompt_tokens - cached - external
        stats.prompt_tokens_recomputed += seq.num_recomputed_tokens

    def _finish(self, seq: Sequence, status: SequenceStatus, output: RequestOutput, now: float, stats: IterationStats) -> None:
        rid = seq.request_id
        hold = rid in self._hold
        self._push_final_block(seq)
        self.scheduler.finish(seq, status, free_blocks=not hold)
        seq.finished_time = now
        output.finished = True
        output.finish_reason = status.value
        output.stop_reason = seq.stop_reason
        if hold:
            self._held[rid] = _HeldBlocks(seq, now + self.config.kv_transfer_timeout_s)
            output.kv_transfer_params = self._kv_transfer_params(seq)
        stats.finished.append(self._finished_stats(seq, status))
        self._forget(rid)

    def _kv_transfer_params(self, seq: Sequence) -> dict:
        num_blocks = math.ceil(seq.num_prompt_tokens / self.config.block_size)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.config.engine_id,
            "remote_block_ids": list(seq.block_table[:num_blocks]),
            "remote_host": self.config.host,
            "remote_port": self.config.port,
            "remote_request_id": seq.request_id,
            "num_tokens": seq.num_prompt_tokens,
        }

    def _finished_stats(self, seq: Sequence, status: SequenceStatus) -> FinishedRequestStats:
        scheduled = seq.first_scheduled_time or seq.arrival_time
        first = seq.first_token_time or seq.finished_time
        last = seq.last_token_time or seq.finished_time
        return FinishedRequestStats(
            finish_reason=status.value,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_generation_tokens=seq.num_output_tokens,
            max_tokens=seq.params.max_tokens,
            n=1,
            num_preemptions=seq.num_preemptions,
            e2e_latency=seq.finished_time - seq.arrival_time,
            queue_time=scheduled - seq.arrival_time,
            prefill_time=first - scheduled,
            decode_time=last - first,
            inference_time=last - scheduled,
            num_cached_tokens=min(seq.num_cached_tokens + seq.num_external_tokens, seq.num_prompt_tokens),
        )

    def _forget(self, request_id: str) -> None:
        self.sampler.forget(request_id)
        self.outputs.forget(request_id)
        self._external_kv.pop(request_id, None)
        self._hold.discard(request_id)
        self._push_sinks.pop(request_id, None)
        self._pushed_blocks.pop(request_id, None)

    # --- push extension --------------------------------------------------------------------------------

    def _push_computed_blocks(self, plan: SchedulerOutput) -> None:
        """Send each prompt block to the decode engine as soon as its K/V is computed."""
        bs = self.config.block_size
        for chunk in plan.chunks:
            seq = chunk.seq
            sink = self._push_sinks.get(seq.request_id)
            if sink is None:
                continue
            full = min(seq.num_computed_tokens, seq.num_prompt_tokens) // bs
            self._push_blocks(seq, sink, full)

    def _push_final_block(self, seq: Sequence) -> None:
        sink = self._push_sinks.get(seq.request_id)
        if sink is None:
            return
        self._push_blocks(seq, sink, math.ceil(seq.num_prompt_tokens / self.config.block_size))
        sink.done(seq.num_prompt_tokens)

    def _push_blocks(self, seq: Sequence, sink: KVPushSink, upto: int) -> None:
        start = self._pushed_blocks.get(seq.request_id, 0)
        for index in range(start, upto):
            sink.push(index, self.runner.export_kv([seq.block_table[index]]))
        self._pushed_blocks[seq.request_id] = max(start, upto)

    # --- stats ----------------------------------------------------------------------------------------

    def _collect_scheduler_counters(self, plan: SchedulerOutput, stats: IterationStats) -> None:
        counters = self.scheduler.take_step_stats()
        stats.num_preemptions = counters.num_preemptions
        stats.prefix_cache_queries = counters.prefix_cache_queries
        stats.prefix_cache_hits = counters.prefix_cache_hits
        stats.external_prefix_cache_queries = counters.external_prefix_cache_queries
        stats.external_prefix_cache_hits = counters.external_prefix_cache_hits
        stats.num_prompt_tokens = sum(c.num_new_tokens for c in plan.chunks if c.start < c.seq.num_prompt_tokens)

    def scheduler_stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            kv_cache_usage=self.block_manager.usage,
            num_blocks=self.block_manager.num_blocks,
            num_free_blocks=self.block_manager.num_free_blocks,
        )

    def reset_prefix_cache(self) -> bool:
        return self.block_manager.reset_prefix_cache()


def _runs(block_ids: list[int]) -> list[tuple[int, int]]:
    """(first id, count) for each run of consecutive ids: [4, 5, 6, 9] -> [(4, 3), (9, 1)]."""
    runs: list[tuple[int, int]] = []
    for block_id in block_ids:
        if runs and runs[-1][0] + runs[-1][1] == block_id:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((block_id, 1))
    return runs
