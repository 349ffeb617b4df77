"""Planted faults: the numeric misconfiguration a `fleetctl drill plant` starts an engine with.

The engine reads `FAULT_ENV` (engine.contract.faults) once at start-up. A fault changes only what the model
runner and the sampler compute; the engine keeps reporting its configured settings (/v1/fleet/config,
vllm:cache_config_info, /v1/models), exactly as a misconfigured server whose class and config diff look
clean. `numeric_config(config, fault, hparams)` is the one place a fault turns into numbers:
- kv_fp16 / kv_bf16: the KV pool holds float16 / bfloat16. The pool keeps the block count the configured
  dtype gives (num_blocks is reported), so a cheaper dtype does not show as a bigger cache;
- approx_topk: the approximate_topk sampler (wrong near-ties at batch >= sampler.APPROX_MIN_BATCH);
- rope_perturb: RoPE positions divided by a hidden ROPE_PERTURBATION, on top of any configured scaling.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.contract.faults import FAULT_ENV, FAULTS, Fault
from engine.reference.config import EngineConfig
from engine.reference.model_runner import kv_pool_blocks
from engine.reference.weights import LlamaHParams

ROPE_PERTURBATION = 1.25  # the hidden linear RoPE factor of rope_perturb


class UnknownFault(ValueError):
    """FAULT_ENV names no planted fault."""


def fault_from_env(environ: Mapping[str, str]) -> Fault | None:
    """The planted fault FAULT_ENV names (None when unset or empty); UnknownFault for any other value."""
    value = environ.get(FAULT_ENV, "").strip()
    if not value:
        return None
    if value not in FAULTS:
        raise UnknownFault(f"{FAULT_ENV}={value!r} is not a planted fault; known faults: {', '.join(FAULTS)}")
    return value  # type: ignore[return-value]


def numeric_config(config: EngineConfig, fault: Fault | None, hparams: LlamaHParams) -> EngineConfig:
    """The settings the model runner and sampler compute with: `config` itself without a fault."""
    if fault is None:
        return config
    if fault in ("kv_fp16", "kv_bf16"):
        pinned_pool = config.num_blocks_override or kv_pool_blocks(config, hparams)
        dtype = "float16" if fault == "kv_fp16" else "bfloat16"
        return config.model_copy(update={"kv_cache_dtype": dtype, "num_blocks_override": pinned_pool})
    if fault == "approx_topk":
        return config.model_copy(update={"sampler": "approximate_topk"})
    if fault == "rope_perturb":
        return config.model_copy(update={"rope_scaling": (config.rope_scaling or 1.0) * ROPE_PERTURBATION})
    raise UnknownFault(f"{fault!r} is not a planted fault; known faults: {', '.join(FAULTS)}")


def describe(fault: Fault) -> str:
    """The start-up WARNING line that lets an operator find an active fault in the engine's log."""
    return (f"PLANTED FAULT ACTIVE ({FAULT_ENV}={fault}): {FAULTS[fault]}; the reported configuration does "
            "not show it")
