"""An engine's own account of its settings (`ReportedConfig`), read from what it serves. Pure over the answers:
the agent (the engines it launched) and the controller (engines it adopted) fetch them and hand them here.

- reference engine: `GET /v1/fleet/config` is the whole answer (source "reference").
- vLLM: `GET /version`, the labels of `vllm:cache_config_info` from `GET /metrics` (vLLM's
  CacheConfig.metrics_info(): block_size, cache_dtype, enable_prefix_caching, gpu_memory_utilization, ...,
  all strings) and `max_model_len` and `root` (the weights it loaded) from `GET /v1/models` (source "vllm").
  A part that does not answer is left out; the rest is still reported.
"""

from __future__ import annotations

from typing import Any

from engine import metric_names
from engine.contract.launched import SETTING_TEXT_MAX, SETTINGS_MAX, ReportedConfig
from engine.contract.prometheus import parse_labels, sample_lines

FLEET_CONFIG_PATH = "/v1/fleet/config"  # the reference engine's effective settings
VLLM_PATHS = ("/version", "/metrics", "/v1/models")  # what vllm_reported reads, in its argument order
# Labels of cache_config_info that are not settings: the engine index (a DP rank) and the served name.
_NOT_SETTINGS = frozenset({"engine", "model_name"})


def vllm_reported(version: Any, metrics_text: str, models: Any) -> ReportedConfig:
    """ReportedConfig from vLLM's answers: `/version`'s body, a `/metrics` text, `/v1/models`' body."""
    settings: dict[str, Any] = dict(cache_config_labels(metrics_text))
    card = first_model_card(models)
    for key in ("max_model_len", "root"):
        if card.get(key) is not None:
            settings[key] = card[key]
    settings = {k: v[:SETTING_TEXT_MAX] if isinstance(v, str) else v for k, v in list(settings.items())[:SETTINGS_MAX]}
    reported_version = version.get("version") if isinstance(version, dict) else None
    return ReportedConfig(source="vllm", version=str(reported_version) if reported_version else None,
                          settings=settings)


def cache_config_labels(metrics_text: str) -> dict[str, str]:
    """The labels of the first `vllm:cache_config_info` sample (every DP rank has the same), or {}."""
    try:
        for name, raw, _value in sample_lines(metrics_text):
            if name == metric_names.CACHE_CONFIG_INFO:
                return {k: v for k, v in parse_labels(raw).items() if k not in _NOT_SETTINGS}
    except ValueError:
        pass
    return {}


def first_model_card(models: Any) -> dict[str, Any]:
    """The first card of a `/v1/models` answer, or {}."""
    if isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"]:
        card = models["data"][0]
        return card if isinstance(card, dict) else {}
    return {}


def served_model_ids(models: Any) -> list[str]:
    """Every model id a `/v1/models` answer lists."""
    if not isinstance(models, dict) or not isinstance(models.get("data"), list):
        return []
    return [str(card["id"]) for card in models["data"] if isinstance(card, dict) and card.get("id") is not None]
