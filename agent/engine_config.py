"""What an engine says it runs: the agent asks once the engine is ready (`fetch_reported`), and what a
launch was (`launched_command`), both reported in the heartbeat (engine.contract.launched).

- reference engine: `GET /v1/fleet/config` is the whole answer (source "reference").
- vLLM: `GET /version`, the labels of `vllm:cache_config_info` from `GET /metrics` (vLLM's
  CacheConfig.metrics_info(): block_size, cache_dtype, enable_prefix_caching, gpu_memory_utilization, ...,
  all strings) and `max_model_len` and `root` (the weights it loaded) from `GET /v1/models` (source "vllm").
  A part that does not answer is left out; the rest is still reported.

The readers of the answers are pure (`vllm_reported`), so tests feed them a vLLM exposition without a GPU.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import httpx
from pydantic import ValidationError

from engine import metric_names
from engine.contract import LaunchedCommand, ReportedConfig, parse_labels, sample_lines
from engine.contract.launched import ARG_MAX, ARGV_MAX, SETTING_TEXT_MAX, SETTINGS_MAX

log = logging.getLogger("fleetctl.agent.engine_config")

FLEET_CONFIG_PATH = "/v1/fleet/config"
# Labels of cache_config_info that are not settings: the engine index (a DP rank) and the served name.
_NOT_SETTINGS = frozenset({"engine", "model_name"})


def launched_command(argv: list[str], env: Mapping[str, str]) -> LaunchedCommand:
    """The report of a launch; an argv longer than the contract allows is cut, and says so in its last item."""
    args = [arg[:ARG_MAX] for arg in argv]
    if len(args) > ARGV_MAX:
        args = args[: ARGV_MAX - 1] + [f"... ({len(argv) - ARGV_MAX + 1} more arguments)"]
    return LaunchedCommand(argv=args, env=dict(env))


async def fetch_reported(http: httpx.AsyncClient, url: str, backend: str) -> ReportedConfig | None:
    """The engine's own account of its settings; None when it did not give one (asked again later)."""
    try:
        if backend == "vllm":
            return await _fetch_vllm(http, url)
        response = await http.get(url + FLEET_CONFIG_PATH)
        response.raise_for_status()
        return ReportedConfig.model_validate(response.json())
    except (httpx.HTTPError, ValueError, ValidationError) as exc:
        log.debug("engine at %s gave no config (%s)", url, type(exc).__name__)
        return None


async def _fetch_vllm(http: httpx.AsyncClient, url: str) -> ReportedConfig | None:
    version, metrics, models = await asyncio.gather(*(_get(http, url + path) for path in ("/version", "/metrics", "/v1/models")))
    if version is None and metrics is None and models is None:
        return None
    return vllm_reported(_json(version), metrics.text if metrics is not None else "", _json(models))


async def _get(http: httpx.AsyncClient, url: str) -> httpx.Response | None:
    try:
        response = await http.get(url)
        return response if response.is_success else None
    except httpx.HTTPError:
        return None


def _json(response: httpx.Response | None) -> Any:
    try:
        return response.json() if response is not None else None
    except ValueError:
        return None


def vllm_reported(version: Any, metrics_text: str, models: Any) -> ReportedConfig:
    """ReportedConfig from vLLM's answers: `/version`'s body, a `/metrics` text, `/v1/models`' body."""
    settings: dict[str, Any] = dict(cache_config_labels(metrics_text))
    card = _first_model(models)
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


def _first_model(models: Any) -> dict[str, Any]:
    if isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"]:
        card = models["data"][0]
        return card if isinstance(card, dict) else {}
    return {}
