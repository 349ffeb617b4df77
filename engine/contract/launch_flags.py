"""The flags an agent renders itself when it launches an engine, per backend: those of the replica class's
fields and those of where the engine listens and what it is called. `engine_args` may not repeat them.

The agent's reference launch (agent/launch.py) and vLLM's adapter (engine/vllm/command.py) render them; the
controller's drift check (fleetctl/controller/drift.py) reads a launched command line against them, so any
other flag on it is one nobody declared. Flags are written without their leading dashes.
"""

from __future__ import annotations

REFERENCE_FLAGS = frozenset({
    "model", "served-model-name", "role", "host", "port", "kv-cache-mib", "block-size", "max-model-len",
    "max-num-seqs", "max-num-batched-tokens", "dtype", "kv-cache-dtype", "rope-scaling", "sampler",
    "enable-prefix-caching", "enable-chunked-prefill", "kv-events-endpoint", "kv-events-replay-endpoint",
    "engine-id", "hash-seed", "kv-tier-url",
})

VLLM_FLAGS = frozenset({
    "model", "served-model-name", "port", "host", "revision", "tokenizer", "tensor-parallel-size",
    "pipeline-parallel-size", "data-parallel-size", "max-model-len", "gpu-memory-utilization", "dtype",
    "kv-cache-dtype", "hf-overrides", "block-size", "enable-prefix-caching", "prefix-caching-hash-algo",
    "enable-chunked-prefill", "max-num-seqs", "max-num-batched-tokens", "kv-events-config",
    "kv-transfer-config", "api-key",
})

RENDERED_FLAGS = {"reference": REFERENCE_FLAGS, "vllm": VLLM_FLAGS}
