"""Render `vllm serve` from a replica class: `render_vllm_command(spec, ...) -> VllmLaunch(argv, env)`.

`spec` is a plain Mapping of ReplicaClassSpec fields (its `model_dump()` / JSON), so this module never imports
the control plane. Each field maps to one flag or environment variable (docs/agent.md has the table):

| spec field / argument       | vLLM                                                                  |
|-----------------------------|-----------------------------------------------------------------------|
| weights                     | positional MODEL of `vllm serve`                                      |
| served_model_name (arg)     | `--served-model-name`                                                 |
| port, host (args)           | `--port`, `--host` (host only when given)                             |
| weights_revision            | `--revision` (omitted when "main", vLLM's own default)                |
| tokenizer                   | `--tokenizer` (when set)                                              |
| tensor/pipeline/data_parallel_size | `--tensor-parallel-size` / `--pipeline-parallel-size` / `--data-parallel-size` (-tp/-pp/-dp) |
| max_model_len               | `--max-model-len`                                                     |
| gpu_memory_utilization      | `--gpu-memory-utilization`                                            |
| dtype                       | `--dtype` (same names: auto, float32, bfloat16, float16)              |
| kv_cache_dtype              | `--kv-cache-dtype`: auto, fp8, bfloat16; equal to dtype -> auto       |
| rope_scaling                | `--hf-overrides {"rope_scaling": {"rope_type": "linear", "factor": F}}` |
| block_size                  | `--block-size`                                                        |
| enable_prefix_caching       | `--enable-prefix-caching` / `--no-enable-prefix-caching`, always with `--prefix-caching-hash-algo sha256_cbor` |
| enable_chunked_prefill      | `--enable-chunked-prefill` / `--no-enable-chunked-prefill`            |
| max_num_seqs, max_num_batched_tokens | `--max-num-seqs`, `--max-num-batched-tokens`                 |
| kv_events_port, replay_port (args) | `--kv-events-config` (ZMQ publisher bound on both ports, topic "kv-events") |
| role prefill / decode (arg) | `--kv-transfer-config {"kv_connector":"NixlConnector","kv_role":"kv_both"}` and env VLLM_NIXL_SIDE_CHANNEL_PORT |
| kv_tiers                    | `--kv-transfer-config`: CPU offloading or LMCache, beside NIXL for P/D (engine/vllm/kv_tiers.py) |
| api_key (arg)               | env VLLM_API_KEY (not argv: argv is visible to every user in `ps`)    |
| hash_seed (arg)             | env PYTHONHASHSEED (vLLM derives NONE_HASH from it), or none for vLLM's own default seed |
| (always)                    | env VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 (events carry the low 64 bits as ints) |
| engine_args                 | `--key value`; `--key` for True; `--no-key` for False                 |
| sampler                     | "exact" renders nothing; "approximate_topk" is a reference-engine feature: an error |
| kv_cache_mib, backend, model | not rendered (reference engine only / chosen by the caller)          |
| engine_version              | not rendered: which vLLM runs is the node's; compared once it reports |
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.contract.kv_tier import kv_layout_key
from engine.contract.launch_flags import VLLM_FLAGS
from engine.hashing import VLLM_DEFAULT_HASH_SEED
from engine.vllm.kv_tiers import transfer_config, tier_connector

ROLES = ("mixed", "prefill", "decode")
KV_EVENTS_TOPIC = "kv-events"
HASH_ALGO = "sha256_cbor"
DEFAULT_TIER_DISK_PATH = "/var/lib/fleetctl/kv-tier"  # a class's kv_tiers.disk_path, when it names none
# KV dtypes every recent vLLM accepts under --kv-cache-dtype (vllm/config/cache.py CacheDType).
VLLM_KV_DTYPES = ("auto", "fp8", "bfloat16")

# Flags this module renders from spec fields (engine.contract.launch_flags); engine_args may not set them again.
RENDERED_FLAGS = VLLM_FLAGS


class VllmRenderError(ValueError):
    """The replica class cannot be served by vLLM as written; `field` names the spec field at fault."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class VllmLaunch:
    """What to exec: `argv` (argv[0] is the vllm executable) with `env` added to the agent's environment."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def render_vllm_command(
    spec: Mapping[str, Any],
    *,
    role: str,
    port: int,
    served_model_name: str,
    hash_seed: str,
    kv_events_port: int,
    replay_port: int,
    api_key: str | None = None,
    side_channel_port: int | None = None,
    host: str | None = None,
    executable: str = "vllm",
    kv_tier_disk_path: str = DEFAULT_TIER_DISK_PATH,
    kv_tier_disk_enabled: bool = True,
) -> VllmLaunch:
    """The `vllm serve` command line and environment for one engine of this class and role."""
    if role not in ROLES:
        raise VllmRenderError(f"role must be one of {ROLES}, got {role!r}", "role")
    argv = [executable, "serve", str(_required(spec, "weights")), "--served-model-name", served_model_name]
    argv += ["--port", str(port)] + (["--host", host] if host else [])
    argv += _model_flags(spec) + _parallel_flags(spec) + _cache_flags(spec) + _batch_flags(spec)
    argv += ["--kv-events-config", _json(kv_events_config(kv_events_port, replay_port))]
    transfer = transfer_config(role, _tier_connector(spec, kv_tier_disk_path, kv_tier_disk_enabled))
    if transfer is not None:
        argv += ["--kv-transfer-config", _json(transfer)]
    argv += render_flags(spec.get("engine_args") or {}, reserved=RENDERED_FLAGS, field="engine_args")
    return VllmLaunch(argv=argv, env=_env(role, hash_seed, api_key, side_channel_port))


def _tier_connector(spec: Mapping[str, Any], disk_path: str, disk_enabled: bool) -> dict[str, Any] | None:
    world = int(spec.get("tensor_parallel_size") or 1) * int(spec.get("pipeline_parallel_size") or 1)
    return tier_connector(spec.get("kv_tiers"), layout=vllm_layout(spec), default_disk_path=disk_path,
                          world_size=world, disk_enabled=disk_enabled)


def vllm_layout(spec: Mapping[str, Any]) -> str:
    """The class's KV layout digest (engine.contract.kv_tier) from its fields: vLLM's block shape is not
    known before it runs, and the fields that decide it are in the digest."""
    return kv_layout_key(weights=str(spec.get("weights")), weights_revision=str(spec.get("weights_revision", "main")),
                         dtype=str(spec.get("dtype", "auto")), kv_cache_dtype=str(spec.get("kv_cache_dtype", "auto")),
                         rope_scaling=spec.get("rope_scaling"), block_size=int(spec.get("block_size") or 16),
                         block_shape=[int(spec.get("tensor_parallel_size") or 1)])


def kv_events_config(kv_events_port: int, replay_port: int) -> dict[str, Any]:
    """vLLM's KVEventsConfig: a ZMQ PUB bound on every interface, with a replay ROUTER beside it."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{kv_events_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": KV_EVENTS_TOPIC,
    }


def _model_flags(spec: Mapping[str, Any]) -> list[str]:
    flags: list[str] = []
    revision = spec.get("weights_revision")
    if revision and revision != "main":
        flags += ["--revision", str(revision)]
    if spec.get("tokenizer"):
        flags += ["--tokenizer", str(spec["tokenizer"])]
    flags += ["--max-model-len", str(_required(spec, "max_model_len"))]
    flags += ["--dtype", str(_required(spec, "dtype"))]
    flags += ["--kv-cache-dtype", _kv_cache_dtype(spec)]
    if spec.get("rope_scaling") is not None:
        overrides = {"rope_scaling": {"rope_type": "linear", "factor": float(spec["rope_scaling"])}}
        flags += ["--hf-overrides", _json(overrides)]
    if spec.get("sampler", "exact") != "exact":
        raise VllmRenderError(f"sampler {spec['sampler']!r} exists only in the reference engine", "sampler")
    return flags


def _kv_cache_dtype(spec: Mapping[str, Any]) -> str:
    kv_dtype, dtype = str(_required(spec, "kv_cache_dtype")), str(_required(spec, "dtype"))
    if kv_dtype == dtype:
        return "auto"  # "auto" is "same as the model's dtype": exactly what the class says
    if kv_dtype not in VLLM_KV_DTYPES:
        raise VllmRenderError(
            f"kv_cache_dtype {kv_dtype!r} with dtype {dtype!r}: vLLM's KV dtypes are {VLLM_KV_DTYPES}",
            "kv_cache_dtype",
        )
    return kv_dtype


def _parallel_flags(spec: Mapping[str, Any]) -> list[str]:
    return [
        "--tensor-parallel-size", str(_required(spec, "tensor_parallel_size")),
        "--pipeline-parallel-size", str(_required(spec, "pipeline_parallel_size")),
        "--data-parallel-size", str(_required(spec, "data_parallel_size")),
        "--gpu-memory-utilization", str(_required(spec, "gpu_memory_utilization")),
    ]


def _cache_flags(spec: Mapping[str, Any]) -> list[str]:
    return [
        "--block-size", str(_required(spec, "block_size")),
        _switch("enable-prefix-caching", bool(_required(spec, "enable_prefix_caching"))),
        "--prefix-caching-hash-algo", HASH_ALGO,
    ]


def _batch_flags(spec: Mapping[str, Any]) -> list[str]:
    return [
        _switch("enable-chunked-prefill", bool(_required(spec, "enable_chunked_prefill"))),
        "--max-num-seqs", str(_required(spec, "max_num_seqs")),
        "--max-num-batched-tokens", str(_required(spec, "max_num_batched_tokens")),
    ]


def render_flags(args: Mapping[str, Any], *, reserved: frozenset[str] = frozenset(), field: str = "engine_args") -> list[str]:
    """{'enforce-eager': True, 'seed': 0} -> ['--enforce-eager', '--seed', '0'], in the mapping's order.

    Keys may be written with dashes, underscores or leading dashes; True is `--key`, False `--no-key`.
    A key in `reserved` (a flag the caller renders itself) is an error naming `field.key`.
    """
    flags: list[str] = []
    for key, value in args.items():
        name = str(key).lstrip("-").replace("_", "-")
        if name in reserved:
            raise VllmRenderError(f"{field} sets --{name}, which is rendered from the class", f"{field}.{key}")
        if isinstance(value, bool):
            flags.append(_switch(name, value))
        else:
            flags += [f"--{name}", str(value)]
    return flags


def _env(role: str, hash_seed: str, api_key: str | None, side_channel_port: int | None) -> dict[str, str]:
    env = {"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "1", **_hash_seed_env(hash_seed)}
    if api_key:
        env["VLLM_API_KEY"] = api_key
    if role != "mixed":
        if side_channel_port is None:
            raise VllmRenderError(f"a {role} engine needs a NIXL side-channel port", "side_channel_port")
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side_channel_port)
    return env


def _hash_seed_env(hash_seed: str) -> dict[str, str]:
    """vLLM's default seed needs no variable (vLLM uses it when PYTHONHASHSEED is unset). Any other seed goes in
    PYTHONHASHSEED, which Python itself reads first and accepts only as "random" or an integer in 0..2**32-1:
    anything else would stop the interpreter before vLLM starts, so it is refused here."""
    if hash_seed == VLLM_DEFAULT_HASH_SEED:
        return {}
    if not hash_seed.isdigit() or int(hash_seed) > 2**32 - 1:
        raise VllmRenderError(f"hash seed {hash_seed!r} cannot be given to vLLM: PYTHONHASHSEED must be an integer "
                              f"in 0..4294967295, or leave it at vLLM's default {VLLM_DEFAULT_HASH_SEED!r}", "hash_seed")
    return {"PYTHONHASHSEED": hash_seed}


def _switch(name: str, on: bool) -> str:
    """vLLM's boolean flags are argparse.BooleanOptionalAction: --name / --no-name."""
    return f"--{name}" if on else f"--no-{name}"


def _required(spec: Mapping[str, Any], name: str) -> Any:
    if spec.get(name) is None:
        raise VllmRenderError(f"the replica class has no {name!r}", name)
    return spec[name]


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
