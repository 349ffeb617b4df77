"""Per-request sampling parameters (the subset of vLLM's SamplingParams the reference engine supports)."""

from __future__ import annotations

from dataclasses import dataclass, field

_GREEDY_EPSILON = 1e-5


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None  # per-request generator: same seed, same tokens
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    # Number of top logprobs to return per generated token; None = no logprobs; 0 = only the sampled token's.
    # Raw logprobs (log_softmax of the logits before temperature/top-k/top-p), as vLLM's default.
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPSILON

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0
