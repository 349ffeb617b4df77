"""What an engine says it runs: the agent asks once the engine is ready (`fetch_reported`), and what a
launch was (`launched_command`), both reported in the heartbeat (engine.contract.launched).

What is asked of each backend, and how the answers are read, is engine.contract.reported (pure, shared with
the controller, which asks the same of engines it adopted).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import httpx
from pydantic import ValidationError

from engine.contract import LaunchedCommand, ReportedConfig
from engine.contract.launched import ARG_MAX, ARGV_MAX
from engine.contract.reported import FLEET_CONFIG_PATH, VLLM_PATHS, vllm_reported

log = logging.getLogger("fleetctl.agent.engine_config")


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
    version, metrics, models = await asyncio.gather(*(_get(http, url + path) for path in VLLM_PATHS))
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
