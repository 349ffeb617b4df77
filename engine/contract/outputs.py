"""What the engine core hands to the serving layer: per-step request deltas and statistics for /metrics.

`LLMEngine.step()` returns `StepResult`; `AsyncEngine` fans its `RequestOutput`s out to the requests'
streams and feeds the stats to `EngineMetrics`. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    """Raw logprob (log_softmax of the logits before temperature/top-k/top-p) of one generated token."""

    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token
    top: list[tuple[int, float]] = field(default_factory=list)  # the top-k (token_id, logprob), best first


@dataclass
class RequestOutput:
    """A request's progress since its previous output (a delta, not the whole text)."""

    request_id: str
    new_token_ids: list[int]
    new_text: str  # incremental detokenised text; a matched stop string is already cut off
    new_logprobs: list[TokenLogprob] | None  # one per new token when the request asked for logprobs
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # so far
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (usage.prompt_tokens_details)
    # Prefill role, P/D: set on the final output of a request that asked for do_remote_decode.
    kv_transfer_params: dict | None = None
    # The smallest and largest running batch (sequences sampled in one step) among the steps that produced
    # its tokens so far; None before the first token, and from engines that do not track it.
    batch_size_min: int | None = None
    batch_size_max: int | None = None


@dataclass
class FinishedRequestStats:
    """One finished request, for vLLM's request-level histograms (seconds)."""

    finish_reason: str  # stop | length | abort
    num_prompt_tokens: int
    num_generation_tokens: int
    max_tokens: int
    n: int
    num_preemptions: int
    e2e_latency: float  # finished - arrival
    queue_time: float  # first scheduled - arrival
    prefill_time: float  # first token - first scheduled
    decode_time: float  # last token - first token
    inference_time: float  # last token - first scheduled
    num_cached_tokens: int = 0  # prompt tokens not computed here: prefix-cache hits and P/D transfers


@dataclass
class IterationStats:
    """One engine step."""

    num_prompt_tokens: int = 0  # prompt tokens computed this step (cache hits excluded)
    num_generation_tokens: int = 0  # tokens sampled this step
    # Prompt lengths of requests that got their first token this step (vLLM counts prompt_tokens_total here).
    prompt_lengths_first_token: list[int] = field(default_factory=list)
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # tokens looked up in the prefix cache this step
    prefix_cache_hits: int = 0  # of which found
    external_prefix_cache_queries: int = 0  # tokens asked of a P/D transfer
    external_prefix_cache_hits: int = 0  # of which it supplied
    # The prompts of the requests that got their first token this step, by where their K/V came from
    # (vllm:prompt_tokens_by_source); recomputed: cached tokens computed again (part of local_compute).
    prompt_tokens_local_compute: int = 0
    prompt_tokens_local_cache_hit: int = 0
    prompt_tokens_external: int = 0
    prompt_tokens_recomputed: int = 0
    finished: list[FinishedRequestStats] = field(default_factory=list)

    @property
    def iteration_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_generation_tokens


@dataclass
class SchedulerStats:
    """Gauges, read after each step."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    num_blocks: int = 0
    num_free_blocks: int = 0


@dataclass
class StepResult:
    outputs: list[RequestOutput] = field(default_factory=list)
    iteration: IterationStats = field(default_factory=IterationStats)
    scheduler: SchedulerStats = field(default_factory=SchedulerStats)
    kv_events: list = field(default_factory=list)  # engine.kv_events.KVEvent, in the order they happened
    # False for the notice sent after a command (abort, prefix-cache reset) changed state between steps:
    # gauges and KV events are current, but no iteration ran, so iteration histograms must not observe it.
    is_step: bool = True
