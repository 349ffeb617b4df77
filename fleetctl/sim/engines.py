"""The engine model: how long prefill and decode take, and how a decode engine batches and runs out of KV.

- `EngineConstants`: one engine's speed (prefill tokens/s; a decode step's time as base + per-sequence x
  batch), as measured on a real engine.
- `PrefillEngine`: a FIFO token server, one prompt at a time at `prefill_tokens_per_s`.
- `DecodeEngine`: a continuous batch of at most `slots` sequences, one token per sequence per step. KV as
  vLLM allocates it: a sequence joins when a slot and KV for what it holds are free and grows by one token
  per step; when this step's new tokens do not fit, the newest sequences are preempted (their KV dropped,
  recomputed at the prefill rate when they run again, as vLLM v1's recompute preemption).

Both engines are plain state plus the rules above; they never read the clock, they are handed `now` and
return when their work ends, and the fleet turns that into events.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fleetctl.sim.requests import SimRequest


@dataclass(frozen=True)
class EngineConstants:
    prefill_tokens_per_s: float
    decode_step_base_s: float
    decode_step_per_seq_s: float
    source: str = "given"  # where the numbers come from (a calibration, a test)

    def step_s(self, batch: int) -> float:
        """Seconds of one decode step at `batch` running sequences."""
        return self.decode_step_base_s + self.decode_step_per_seq_s * batch


# The reference engine (SmolLM2-135M, float32, 1 torch thread), measured with benchmarks/admission.py
# --calibrate on a 2-core development machine with a load average of ~9 from other jobs (prefill runs of
# 173/135/162 tok/s; decode step 0.086 s at batch 1, 0.277 s at 16, 0.618 s at 48). Where the fleet is sized
# from the constants, only their ratios to each other and to the arrival rate shape a result.
REFERENCE_SMOLLM2_CPU = EngineConstants(prefill_tokens_per_s=162.4, decode_step_base_s=0.0745,
                                        decode_step_per_seq_s=0.01132, source="calibrated 2026-11-29 (DEFAULT_CONSTANTS)")


@dataclass(eq=False)
class PrefillEngine:
    name: str
    tokens_per_s: float
    queue: deque[SimRequest] = field(default_factory=deque)  # waiting, FIFO
    current: SimRequest | None = None
    done_at: float = 0.0  # when `current` finishes
    # counters, as an engine reports them (engine.contract.EngineMetrics): prompts done and their tokens
    prefilled: int = 0
    prompt_tokens_done: int = 0

    def queued_tokens(self, now: float) -> int:
        """Prompt tokens still to prefill: the queue's, and what is left of the one in service."""
        left = (self.done_at - now) * self.tokens_per_s if self.current is not None else 0.0
        return int(sum(r.prompt for r in self.queue) + max(0.0, left))

    def length(self) -> int:
        """Requests waiting or in service."""
        return len(self.queue) + (self.current is not None)

    def start_next(self, now: float) -> float | None:
        """Take the next prompt if idle; the time it will be done, or None when nothing started."""
        if self.current is not None or not self.queue:
            return None
        self.current = self.queue.popleft()
        self.done_at = now + self.current.prompt / self.tokens_per_s
        return self.done_at

    def finish(self) -> SimRequest:
        request, self.current = self.current, None
        assert request is not None, "finish() without a prompt in service"
        self.prefilled += 1
        self.prompt_tokens_done += request.prompt
        return request

    def idle(self) -> bool:
        return self.current is None and not self.queue


@dataclass(eq=False)
class DecodeEngine:
    name: str
    slots: int  # max_num_seqs
    kv_capacity: int  # KV pool, in tokens
    constants: EngineConstants
    waiting: deque[SimRequest] = field(default_factory=deque)  # prefilled (or preempted), waiting for a slot and KV
    running: list[SimRequest] = field(default_factory=list)  # in the batch, oldest first
    bound: dict[int, SimRequest] = field(default_factory=dict)  # admitted here, still in prefill (by request id)
    stepping: bool = False
    preemptions: int = 0
    # counters, as an engine reports them: sequences that got their first token, tokens generated
    started: int = 0
    generated_tokens: int = 0

    def kv_used(self) -> int:
        return sum(r.prompt + r.generated for r in self.running)  # kv_tokens, inlined: a hot path

    def admitted_ahead(self) -> list[SimRequest]:
        """Requests admitted here that have not started decoding: in prefill, or waiting."""
        return [*self.bound.values(), *self.waiting]

    def start_step(self, now: float) -> float | None:
        """Fill the batch, make room for the step's new tokens, and start the step: the time it ends, or
        None when a step is already running or nothing is left to decode."""
        if self.stepping:
            return None
        used = self._fill_batch()
        self._preempt_to_fit(used)
        if not self.running:
            return None
        recompute = self._take_recompute()
        self.stepping = True
        # The step, then the recompute of re-admitted sequences at the prefill rate (summed in this order).
        return now + self.constants.step_s(len(self.running)) + recompute / self.constants.prefill_tokens_per_s

    def finish_step(self, now: float) -> list[SimRequest]:
        """Every running sequence gets one token; the ones now done leave the batch and are returned."""
        self.stepping = False
        finished, still = [], []
        self.generated_tokens += len(self.running)
        for request in self.running:
            request.generated += 1
            if request.first_token_s is None:
                request.first_token_s = now
                self.started += 1
            if request.done:
                request.finished_s = now
                finished.append(request)
            else:
                still.append(request)
        self.running = still
        return finished

    def idle(self) -> bool:
        return not self.running and not self.waiting and not self.bound and not self.stepping

    def _fill_batch(self) -> int:
        """Move waiting sequences into free slots while their KV fits (the first always fits an empty
        batch, so an engine never stalls on one long sequence); the KV held after."""
        used = self.kv_used()
        while self.waiting and len(self.running) < self.slots:
            need = self.waiting[0].kv_tokens + 1
            if used + need > self.kv_capacity and self.running:
                break
            self.running.append(self.waiting.popleft())
            used += need - 1
        return used

    def _preempt_to_fit(self, used: int) -> None:
        """Preempt the newest sequences until every running one can add its next token (one always stays)."""
        while self.running and used + len(self.running) > self.kv_capacity and len(self.running) > 1:
            victim = self.running.pop()
            used -= victim.kv_tokens
            victim.needs_recompute = True
            victim.preemptions += 1
            self.waiting.appendleft(victim)
            self.preemptions += 1

    def _take_recompute(self) -> int:
        """Tokens to recompute for preempted sequences back in the batch (their flag is cleared)."""
        recompute = 0
        for request in self.running:
            if request.needs_recompute:
                recompute += request.kv_tokens
                request.needs_recompute = False
        return recompute
