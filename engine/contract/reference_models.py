"""The reference engine's models and its on-disk cache, as the processes that never load it need to know them.

`REFERENCE_MODELS` is the one list of model names the reference engine serves ("smollm2" is SmolLM2-135M
-Instruct, "tiny" a seeded random model sharing its tokenizer). The engine caches SmolLM2's dequantised
weights and tokenizer under `smollm2_cache_dir()`; the gateway reads the tokenizer from there without
importing the engine (which imports torch).
"""

from __future__ import annotations

import os
from pathlib import Path

REFERENCE_MODELS: tuple[str, ...] = ("smollm2", "tiny")
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct-q4_1"


def default_cache_dir() -> Path:
    """Where dequantised weights and the tokenizer are cached (FLEET_CACHE_DIR, else ~/.cache/fleetctl)."""
    return Path(os.environ.get("FLEET_CACHE_DIR", Path.home() / ".cache" / "fleetctl"))


def smollm2_cache_dir(cache_dir: Path | None = None) -> Path:
    """The folder holding SmolLM2's cached weights and tokenizer under `cache_dir` (default: the default)."""
    return (cache_dir or default_cache_dir()) / SMOLLM2_CACHE_NAME
