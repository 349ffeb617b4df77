"""Replica classes: a named, versioned, immutable description of how a model is served.

Every field is tagged `correctness` (it can change the tokens a request gets) or `performance` (it cannot).
The tag drives config diffs, the traffic-split guard and rollout gating: two revisions whose correctness
fields differ must not silently share a model's traffic.

`engine_args` is tagged per flag: a flag is correctness-relevant unless it is on PERFORMANCE_ONLY_ENGINE_ARGS
(a free-form flag such as `quantization` changes tokens, and an unknown flag is assumed to). `diff()` reports
each flag as its own field `engine_args.FLAG` with that flag's tag.

A revision is content-addressed: `digest()` hashes the canonical JSON of the spec, so applying identical
content is a no-op and changed content becomes the next revision `NAME@rN`. An unset `engine_version` is
left out of the hash (so is an unset `kv_tiers`), so the digest of content written before those fields existed does
not change.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.contract import REFERENCE_MODELS
from engine.contract.bounds import Finite, Int64, SafeStr

CORRECTNESS = "correctness"
PERFORMANCE = "performance"

NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
REF_PATTERN = re.compile(r"^(?P<name>[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)@r(?P<revision>[1-9][0-9]*)$")


EngineArgName = Annotated[SafeStr, Field(min_length=1, max_length=100)]
EngineArgValue = bool | Int64 | Finite | Annotated[SafeStr, Field(max_length=4000)]

ENGINE_ARGS = "engine_args"
# engine_args flags that cannot change the tokens a request gets, each with why. Any other flag is
# correctness-relevant. Keys are flag names as rendered (dashes, no leading `--`): see engine_arg_flag().
PERFORMANCE_ONLY_ENGINE_ARGS: dict[str, str] = {
    "enforce-eager": "vLLM: runs the same kernels without CUDA-graph capture; like the batch limits, it changes only "
                     "how steps are launched",
    "max-num-partial-prefills": "vLLM: how many prefills may be chunked at once; a scheduling limit like max_num_seqs",
    "max-long-partial-prefills": "vLLM: how many of those may be long prompts; a scheduling limit",
    "long-prefill-token-threshold": "vLLM: the length that makes a prompt 'long' for that limit; scheduling only",
    "disable-log-requests": "vLLM: request logging off (older spelling); logging only",
    "enable-log-requests": "vLLM: request logging on (newer spelling); logging only",
    "disable-log-stats": "vLLM: periodic stats logging off; logging only",
    "uvicorn-log-level": "vLLM: the HTTP server's log level; logging only",
    "swap-space": "vLLM (V0): CPU swap for preempted sequences; a preempted sequence resumes with the same KV "
                  "(swapped back, or recomputed without it)",
    "num-scheduler-steps": "vLLM (V0 only, removed in V1): decode steps per scheduler call; the same forward passes "
                           "and sampling, fewer scheduler round trips",
    "debug-step-delay-ms": "reference engine, test-only: waits after the forward pass of each step that computes tokens; adds latency, never "
                           "changes tokens",
    "drain-grace-s": "reference engine: how long in-flight requests may finish on a drain; lifecycle only",
    "keepalive-interval-s": "reference engine: SSE keep-alive comments on long streams; no tokens in them",
    "kv-transfer-timeout-s": "reference engine, P/D: a transfer that times out is recomputed, never answered "
                             "differently",
}
# Not on the list on purpose: `num-threads` (torch's thread count can change the order of float sums on CPU),
# `seed`, `quantization`, `speculative-config`, `generation-config` and anything unknown.


def _tag(tag: str, description: str, **kwargs: Any) -> Any:
    return Field(description=description, json_schema_extra={"tag": tag}, **kwargs)


class KVTiers(BaseModel):
    """The node's KV tiers an engine of the class may use, behind its own KV memory (docs/kv-tiers.md).
    Performance only: a block is loaded only into an engine whose KV layout equals the one that stored it, and its
    tokens are checked, so a tier hit gives the K/V that computing the prefix would have."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dram_mib: int = Field(default=0, ge=0, le=16_777_216, description="host DRAM tier, MiB, shared by the node's "
                          "engines of the class; 0: none")
    disk_mib: int = Field(default=0, ge=0, le=1_073_741_824, description="local-disk tier, MiB; 0: none")
    disk_path: SafeStr | None = Field(default=None, min_length=1, max_length=500, description="directory of the "
                                      "disk tier; default: under the agent's state directory (reference) or "
                                      "/var/lib/fleetctl/kv-tier (vLLM)")


class ReplicaClassSpec(BaseModel):
    """What a replica class says about how to serve its model. Validated completely before it is stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # --- correctness: any change here can change the tokens a request gets ---
    model: SafeStr = _tag(CORRECTNESS, "the name clients ask for, e.g. smollm2-135m", min_length=1, max_length=200)
    backend: Literal["reference", "vllm"] = _tag(CORRECTNESS, "engine implementation", default="reference")
    weights: SafeStr = _tag(CORRECTNESS, "weights: 'smollm2' or 'tiny' for the reference engine; a model id or path for vLLM", min_length=1, max_length=500)
    weights_revision: SafeStr = _tag(CORRECTNESS, "revision of the weights (a hub revision or file digest)", default="main", min_length=1, max_length=200)
    tokenizer: SafeStr | None = _tag(CORRECTNESS, "tokenizer, if not the weights' own", default=None, max_length=500)
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = _tag(CORRECTNESS, "weights/activation dtype", default="float32")
    kv_cache_dtype: Literal["auto", "float32", "bfloat16", "float16", "fp8"] = _tag(CORRECTNESS, "KV cache dtype", default="auto")
    max_model_len: int = _tag(CORRECTNESS, "context window in tokens", default=2048, gt=0, le=1_048_576)
    rope_scaling: float | None = _tag(CORRECTNESS, "linear RoPE scaling factor", default=None, gt=0, le=1024, allow_inf_nan=False)
    sampler: Literal["exact", "approximate_topk"] = _tag(CORRECTNESS, "sampler implementation", default="exact")
    engine_version: SafeStr | None = _tag(
        CORRECTNESS, "the engine's own version: the reference engine's package version (fleetctl's), vLLM's version "
        "or image digest; None: whatever the node runs (a diff from None to a version is still a change)",
        default=None, min_length=1, max_length=200)
    # --- performance: cannot change tokens ---
    block_size: int = _tag(PERFORMANCE, "tokens per KV block", default=16, gt=0, le=256)
    enable_prefix_caching: bool = _tag(PERFORMANCE, "reuse KV of shared prompt prefixes", default=True)
    enable_chunked_prefill: bool = _tag(PERFORMANCE, "split long prefills so decodes keep flowing", default=True)
    max_num_seqs: int = _tag(PERFORMANCE, "sequences per batch", default=64, gt=0, le=65_536)
    max_num_batched_tokens: int = _tag(PERFORMANCE, "tokens computed per step", default=512, gt=0, le=1_048_576)
    kv_cache_mib: int = _tag(PERFORMANCE, "reference engine: KV pool size in MiB", default=256, gt=0, le=1_048_576)
    gpu_memory_utilization: float = _tag(PERFORMANCE, "vLLM: fraction of GPU memory", default=0.9, gt=0, le=1)
    tensor_parallel_size: int = _tag(PERFORMANCE, "vLLM: tensor parallel size", default=1, gt=0, le=64)
    pipeline_parallel_size: int = _tag(PERFORMANCE, "vLLM: pipeline parallel size", default=1, gt=0, le=64)
    data_parallel_size: int = _tag(PERFORMANCE, "vLLM: data parallel size", default=1, gt=0, le=64)
    kv_tiers: KVTiers | None = _tag(PERFORMANCE, "KV tiers behind the engine's memory: {dram_mib, disk_mib, "
                                    "disk_path}; none by default", default=None)
    # --- per flag: correctness unless the flag is on PERFORMANCE_ONLY_ENGINE_ARGS ---
    engine_args: dict[EngineArgName, EngineArgValue] = _tag(
        CORRECTNESS, "extra engine flags, e.g. {'enforce-eager': true}; tagged per flag (correctness unless on "
        "PERFORMANCE_ONLY_ENGINE_ARGS)", default_factory=dict, max_length=64)

    @field_validator("model", "weights", "weights_revision", "engine_version")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be blank")
        return value

    @model_validator(mode="after")
    def _batch_fits(self) -> "ReplicaClassSpec":
        if self.backend == "reference" and self.weights not in REFERENCE_MODELS:
            raise ValueError(f"weights: the reference backend serves {' or '.join(map(repr, REFERENCE_MODELS))}")
        return self

    def digest(self) -> str:
        content = self.model_dump(mode="json")
        for name in ("engine_version", "kv_tiers"):  # unset: digests of content from before the field stay
            if content[name] is None:
                del content[name]
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def field_tags() -> dict[str, str]:
    """field name -> 'correctness' | 'performance'. `engine_args` is 'correctness' here (an unknown flag may
    change tokens); diff() refines it per flag with engine_arg_tag()."""
    return {name: (info.json_schema_extra or {})["tag"] for name, info in ReplicaClassSpec.model_fields.items()}


def correctness_fields() -> list[str]:
    return [name for name, tag in field_tags().items() if tag == CORRECTNESS]


def engine_arg_flag(key: str) -> str:
    """The flag an engine_args key renders as: 'enforce_eager', '--enforce-eager' -> 'enforce-eager'."""
    return key.lstrip("-").replace("_", "-")


def engine_arg_tag(key: str) -> str:
    """A flag is performance-only when it is on the documented list; any other flag may change tokens."""
    return PERFORMANCE if engine_arg_flag(key) in PERFORMANCE_ONLY_ENGINE_ARGS else CORRECTNESS


def correctness_values(spec: ReplicaClassSpec) -> dict[str, Any]:
    """The spec's correctness-tagged fields and their JSON values; engine_args only with its
    correctness-relevant flags."""
    values = spec.model_dump(mode="json")
    shown = {name: values[name] for name in correctness_fields()}
    shown[ENGINE_ARGS] = {flag: value for flag, value in _flags(spec).items() if engine_arg_tag(flag) == CORRECTNESS}
    return shown


def correctness_digest(spec: ReplicaClassSpec) -> str:
    """sha256 of the correctness-tagged values (None values left out, as the spec digest leaves out an unset
    engine_version): two revisions with the same one give the same tokens, so the canary compares them exactly."""
    values = {k: v for k, v in correctness_values(spec).items() if v is not None}
    return hashlib.sha256(json.dumps(values, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def diff(old: ReplicaClassSpec, new: ReplicaClassSpec) -> list[dict[str, Any]]:
    """Changed fields, each {field, tag, old, new}, correctness first. engine_args is reported per flag as
    `engine_args.FLAG`, with None for a flag that one side does not set."""
    tags = field_tags()
    before, after = old.model_dump(mode="json"), new.model_dump(mode="json")
    changes = [
        {"field": name, "tag": tags[name], "old": before[name], "new": after[name]}
        for name in ReplicaClassSpec.model_fields
        if name != ENGINE_ARGS and before[name] != after[name]
    ]
    changes += _engine_arg_changes(_flags(old), _flags(new))
    return sorted(changes, key=lambda c: (c["tag"] != CORRECTNESS, c["field"]))


def _flags(spec: ReplicaClassSpec) -> dict[str, Any]:
    return {engine_arg_flag(key): value for key, value in spec.engine_args.items()}


def _engine_arg_changes(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    flags = sorted(set(before) | set(after))
    return [
        {"field": f"{ENGINE_ARGS}.{flag}", "tag": engine_arg_tag(flag), "old": before.get(flag), "new": after.get(flag)}
        for flag in flags
        if flag not in before or flag not in after or not _same(before[flag], after[flag])
    ]


def _same(a: Any, b: Any) -> bool:
    # True == 1 == 1.0 in Python, but `--flag`, `--flag 1` and `--flag 1.0` are different command lines
    return type(a) is type(b) and a == b


def correctness_differences(old: ReplicaClassSpec, new: ReplicaClassSpec) -> list[str]:
    """Names of correctness-tagged fields that differ (empty: the two classes give the same tokens)."""
    return [c["field"] for c in diff(old, new) if c["tag"] == CORRECTNESS]


def parse_ref(ref: str) -> tuple[str, int]:
    """'chat@r3' -> ('chat', 3). Raises ValueError naming the expected form."""
    match = REF_PATTERN.match(ref)
    if not match:
        raise ValueError(f"class reference {ref!r} is not of the form NAME@rN")
    return match["name"], int(match["revision"])


def format_ref(name: str, revision: int) -> str:
    return f"{name}@r{revision}"
