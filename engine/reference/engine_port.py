"""What the HTTP server and the P/D K/V transfer need from an engine, as structural types.

`AsyncEngine` (engine.reference.async_engine) is the engine that satisfies them in production; tests hand the
server a scripted engine (no model) that implements the same names. Nothing here imports torch at run time,
so the server's typing costs no import.

Two layers, because the K/V transfer needs less than the server:
- `KVEnginePort`: the K/V cache's layout, exporting and releasing blocks held for a pull, and running a
  function on the engine thread from any thread (the side channel's connection threads).
- `EnginePort`: that, plus the tokenizer, request validation and generation, the scheduler's stats, step
  listeners and the prefix cache reset.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from engine.reference.kv_sinks import KVPushSink
    from engine.reference.llm_engine import LLMEngine
    from engine.contract.outputs import RequestOutput, SchedulerStats, StepResult
    from engine.contract.sampling_params import SamplingParams


class Tokenizer(Protocol):
    """The slice of a Hugging Face tokenizer the server calls."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                            tokenize: bool = False) -> str: ...

    def __len__(self) -> int: ...


class KVEnginePort(Protocol):
    """What engine.reference.kv_transfer calls: the cache layout and the held-block exports."""

    @property
    def num_blocks(self) -> int: ...

    @property
    def kv_dtype(self) -> torch.dtype: ...

    @property
    def kv_block_shape(self) -> tuple[int, ...]:
        """One block: (layers, 2, block_size, kv_heads, head_dim)."""
        ...

    async def pull_held(self, request_id: str, block_ids: list[int], out: torch.Tensor | None = None,
                        release: bool = True) -> torch.Tensor:
        """Export blocks a finished P/D request holds (into `out` if given), then free them unless `release`
        is false."""
        ...

    async def release_held(self, request_id: str) -> bool: ...

    def submit(self, fn: Callable[[LLMEngine], Any]) -> concurrent.futures.Future:
        """Run fn(engine core) on the engine thread, from any thread."""
        ...


class EnginePort(KVEnginePort, Protocol):
    """What engine.reference.server calls on a started engine."""

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def block_size(self) -> int: ...

    @property
    def bytes_per_block(self) -> int: ...

    @property
    def ready(self) -> bool: ...

    def add_step_listener(self, fn: Callable[[StepResult], None]) -> None: ...

    def stats(self) -> SchedulerStats: ...

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise engine.errors.* naming the field if the request can never run."""
        ...

    def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *,
                 external_kv: torch.Tensor | None = None, external_kv_tokens: int = 0,
                 external_kv_first_block: int = 0, hold_blocks: bool = False,
                 kv_push: KVPushSink | None = None) -> AsyncIterator[RequestOutput]:
        """The request's outputs; leaving the iteration early aborts it."""
        ...

    async def reset_prefix_cache(self) -> bool: ...

    def cached_prefix_blocks(self, hashes: list) -> int:
        """A hint from any thread: the leading blocks of `hashes` the prefix cache holds now."""
        ...
