"""`GET /v1/fleet/config`: the reference engine's effective settings, as the engine itself runs them.

The agent fetches this once the engine is ready and reports it in its heartbeat (engine.contract.launched
`ReportedConfig`, source "reference"), so the controller compares what the engine says it runs with the
class revision it was started for. Values are resolved: `kv_cache_dtype` is the dtype the KV pool holds
(never "auto"), `num_blocks` the pool's real size. Nothing secret is reported (no API key, no hash seed).
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from engine.reference.config import EngineConfig

SOURCE = "reference"
# EngineConfig fields reported as they are (the rest are where it listens, secrets, or tuning of transfers).
REPORTED_FIELDS = (
    "model", "served_model_name", "dtype", "rope_scaling", "sampler", "max_model_len", "seed", "kv_cache_mib",
    "block_size", "enable_prefix_caching", "enable_chunked_prefill", "max_num_seqs", "max_num_batched_tokens",
    "role",
)


def engine_version() -> str:
    """The version of the installed package that holds the reference engine ("unknown" in a bare checkout)."""
    try:
        return metadata.version("fleetctl")
    except metadata.PackageNotFoundError:
        return "unknown"


def effective_config(config: EngineConfig, num_blocks: int) -> dict[str, Any]:
    settings = {name: getattr(config, name) for name in REPORTED_FIELDS}
    settings["kv_cache_dtype"] = config.resolved_kv_cache_dtype
    settings["num_blocks"] = num_blocks
    return {"source": SOURCE, "version": engine_version(), "settings": settings}
