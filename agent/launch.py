"""How an assignment becomes a command line: the reference engine (`python -m engine.reference ...`, flags
mirroring engine.reference.config.EngineConfig) or vLLM (through engine.vllm's adapter).

Port layout of an engine's block starting at P, for data-parallel size DP (1 for the reference engine):

    P                     http (OpenAI API, /health, /metrics, /drain)
    P+1 .. P+DP           KV events PUB (vLLM offsets the port by DP rank)
    P+1+DP .. P+2*DP      KV events replay ROUTER
    P+1+2*DP .. P+3*DP    NIXL side channel (vLLM prefill/decode engines only)

so a reference engine takes three consecutive ports: http, KV events, replay.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.contract import EngineAssignment, reference_engine_version
from engine.contract.faults import FAULT_ENV
from engine.contract.launch_flags import REFERENCE_FLAGS
from engine.vllm import render_flags, render_vllm_command

LOOPBACK = "127.0.0.1"
# REFERENCE_FLAGS: flags rendered from the class for the reference engine; engine_args may not repeat them.
REFERENCE_KV_DTYPES = ("auto", "float32", "bfloat16", "float16")


class LaunchError(ValueError):
    """The assignment cannot be launched as written (the message says why); the engine is reported failed."""


@dataclass(frozen=True)
class PortBlock:
    http: int
    kv_events: int
    replay: int
    side_channel: int | None = None

    @property
    def ports(self) -> list[int]:
        return [p for p in (self.http, self.kv_events, self.replay, self.side_channel) if p is not None]


@dataclass(frozen=True)
class EngineLaunch:
    """What to exec: `argv` with `env` added to the agent's own environment."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def planted_fault_env(assignment: EngineAssignment) -> dict[str, str]:
    """The environment a canary drill's planted fault adds (FAULT_ENV); nothing for a clean engine. Kept
    out of EngineLaunch, whose env is reported as launched: the drill's engine must look clean."""
    return {FAULT_ENV: assignment.planted_fault} if assignment.planted_fault else {}


def class_name_of(assignment: EngineAssignment) -> str:
    return assignment.class_ref.split("@", 1)[0]


def wants_kv_tiers(assignment: EngineAssignment) -> bool:
    tiers = assignment.spec.get("kv_tiers") or {}
    return bool(tiers.get("dram_mib") or tiers.get("disk_mib"))


def backend_of(assignment: EngineAssignment) -> str:
    return str(assignment.spec.get("backend", "reference"))


def port_width(assignment: EngineAssignment) -> int:
    """How many consecutive ports this engine's block spans (see the module docstring)."""
    if backend_of(assignment) != "vllm":
        return 3
    dp = int(assignment.spec.get("data_parallel_size") or 1)
    return 1 + (3 if assignment.role != "mixed" else 2) * dp


def port_layout(start: int, assignment: EngineAssignment) -> PortBlock:
    dp = int(assignment.spec.get("data_parallel_size") or 1) if backend_of(assignment) == "vllm" else 1
    side = start + 1 + 2 * dp if backend_of(assignment) == "vllm" and assignment.role != "mixed" else None
    return PortBlock(http=start, kv_events=start + 1, replay=start + 1 + dp, side_channel=side)


def render_launch(
    assignment: EngineAssignment,
    ports: PortBlock,
    *,
    hash_seed: str,
    host: str = LOOPBACK,
    python: str = sys.executable,
    vllm_executable: str = "vllm",
    kv_tier_url: str | None = None,
    kv_tier_dir: str | None = None,
    kv_tier_disk_enabled: bool = True,
) -> EngineLaunch:
    """The command for one engine. Raises LaunchError when the class cannot run on its backend. `kv_tier_url`:
    the node's tier of the engine's class (reference engines; vLLM keeps its tiers in-process, under
    `kv_tier_dir`)."""
    backend = backend_of(assignment)
    try:
        if backend == "reference":
            return reference_launch(assignment, ports, hash_seed=hash_seed, host=host, python=python,
                                    kv_tier_url=kv_tier_url)
        if backend == "vllm":
            launch = render_vllm_command(
                assignment.spec, role=assignment.role, port=ports.http, served_model_name=assignment.model,
                hash_seed=hash_seed, kv_events_port=ports.kv_events, replay_port=ports.replay,
                side_channel_port=ports.side_channel, host=None if host == LOOPBACK else host,
                executable=vllm_executable, kv_tier_disk_enabled=kv_tier_disk_enabled,
                **({"kv_tier_disk_path": kv_tier_dir} if kv_tier_dir else {}),
            )
            return EngineLaunch(argv=launch.argv, env=launch.env)
    except (ValueError, KeyError, TypeError) as exc:
        raise LaunchError(f"class {assignment.class_ref}: {exc}") from exc
    raise LaunchError(f"class {assignment.class_ref}: unknown backend {backend!r}")


def reference_launch(
    assignment: EngineAssignment, ports: PortBlock, *, hash_seed: str, host: str = LOOPBACK, python: str = sys.executable,
    kv_tier_url: str | None = None,
) -> EngineLaunch:
    """`python -m engine.reference ...` (engine/reference/cli_args.py: one flag per EngineConfig field)."""
    spec = assignment.spec
    _check_engine_version(spec)
    argv = [python, "-m", "engine.reference", "--model", str(spec["weights"]),
            "--served-model-name", assignment.model, "--role", assignment.role, "--port", str(ports.http)]
    if host != LOOPBACK:
        argv += ["--host", host]
    argv += _reference_sizes(spec) + _reference_numerics(spec)
    argv += [] if spec.get("enable_prefix_caching", True) else ["--no-enable-prefix-caching"]
    argv += [] if spec.get("enable_chunked_prefill", True) else ["--no-enable-chunked-prefill"]
    argv += ["--kv-events-endpoint", f"tcp://{host}:{ports.kv_events}",
             "--kv-events-replay-endpoint", f"tcp://{host}:{ports.replay}",
             "--engine-id", assignment.name, "--hash-seed", hash_seed]
    argv += ["--kv-tier-url", kv_tier_url] if kv_tier_url else []
    argv += render_flags(spec.get("engine_args") or {}, reserved=REFERENCE_FLAGS)
    return EngineLaunch(argv=argv)


def _check_engine_version(spec: Mapping[str, Any]) -> None:
    # A pinned version is a correctness field: another build of the engine may give other tokens. vLLM's
    # version is not known before it runs; its engines are compared with their class once they report.
    declared = spec.get("engine_version")
    if declared is not None and declared != (running := reference_engine_version()):
        raise LaunchError(f"engine_version {declared!r}: this node's reference engine is {running!r}")


def _reference_sizes(spec: Mapping[str, Any]) -> list[str]:
    names = ("kv_cache_mib", "block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens")
    return [token for name in names for token in (_flag(name), str(spec[name]))]


def _reference_numerics(spec: Mapping[str, Any]) -> list[str]:
    # "auto" means "the weights' own dtype": the reference engine computes in float32 unless told otherwise.
    dtype = "float32" if spec["dtype"] == "auto" else str(spec["dtype"])
    kv_dtype = str(spec.get("kv_cache_dtype", "auto"))
    if kv_dtype not in REFERENCE_KV_DTYPES:
        raise LaunchError(f"kv_cache_dtype {kv_dtype!r}: the reference engine holds KV in {REFERENCE_KV_DTYPES}")
    flags = ["--dtype", dtype, "--kv-cache-dtype", kv_dtype]
    if spec.get("rope_scaling") is not None:
        flags += ["--rope-scaling", str(spec["rope_scaling"])]
    return flags + ["--sampler", str(spec.get("sampler", "exact"))]


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")
