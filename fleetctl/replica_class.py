"""Replica classes: a named, versioned, immutable description of how a model is served.

Every field is tagged `correctness` (it can change the tokens a request gets) or `performance` (it cannot).
The tag drives config diffs, the traffic-split guard and rollout gating: two revisions whose correctness
fields differ must not silently share a model's traffic.

A revision is content-addressed: `digest()` hashes the canonical JSON of the spec, so applying identical
content is a no-op and changed content becomes the next revision `NAME@rN`.
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


def _tag(tag: str, description: str, **kwargs: Any) -> Any:
    return Field(description=description, json_schema_extra={"tag": tag}, **kwargs)


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
    engine_args: dict[EngineArgName, EngineArgValue] = _tag(
        PERFORMANCE, "extra engine flags, e.g. {'enforce-eager': true}", default_factory=dict, max_length=64)

    @field_validator("model", "weights", "weights_revision")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @model_validator(mode="after")
    def _batch_fits(self) -> "ReplicaClassSpec":
        if self.backend == "reference" and self.weights not in REFERENCE_MODELS:
            raise ValueError(f"weights: the reference backend serves {' or '.join(map(repr, REFERENCE_MODELS))}")
        return self

    def digest(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def field_tags() -> dict[str, str]:
    """field name -> 'correctness' | 'performance'."""
    return {name: (info.json_schema_extra or {})["tag"] for name, info in ReplicaClassSpec.model_fields.items()}


def correctness_fields() -> list[str]:
    return [name for name, tag in field_tags().items() if tag == CORRECTNESS]


def diff(old: ReplicaClassSpec, new: ReplicaClassSpec) -> list[dict[str, Any]]:
    """Changed fields, each {field, tag, old, new}, correctness first."""
    tags = field_tags()
    before, after = old.model_dump(mode="json"), new.model_dump(mode="json")
    changes = [
        {"field": name, "tag": tags[name], "old": before[name], "new": after[name]}
        for name in ReplicaClassSpec.model_fields
        if before[name] != after[name]
    ]
    return sorted(changes, key=lambda c: (c["tag"] != CORRECTNESS, c["field"]))


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
