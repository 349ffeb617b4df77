"""GET /v1/fleet/config of a real reference engine: its effective settings, resolved (a KV dtype of "auto"
is the dtype it holds), open like /metrics, and exactly what the agent reports (ReportedConfig)."""

from __future__ import annotations

import httpx

from engine.contract import ReportedConfig


def test_the_engine_reports_its_effective_settings(launch_engine) -> None:
    engine = launch_engine("--kv-cache-dtype", "bfloat16", "--max-num-seqs", "7", api_key="not-needed-here")
    response = httpx.get(f"{engine.url}/v1/fleet/config", timeout=30)
    assert response.status_code == 200
    reported = ReportedConfig.model_validate(response.json())
    assert reported.source == "reference" and reported.version
    settings = reported.settings
    assert (settings["kv_cache_dtype"], settings["dtype"], settings["max_num_seqs"]) == ("bfloat16", "float32", 7)
    assert (settings["model"], settings["served_model_name"], settings["kv_cache_mib"]) == ("tiny", "tiny", 16)
    assert settings["num_blocks"] > 0 and settings["enable_prefix_caching"] is True
    assert "not-needed-here" not in response.text and "api_key" not in settings


def test_auto_kv_dtype_is_reported_as_the_dtype_it_holds(launch_engine) -> None:
    engine = launch_engine("--dtype", "bfloat16")
    settings = httpx.get(f"{engine.url}/v1/fleet/config", timeout=30).json()["settings"]
    assert (settings["dtype"], settings["kv_cache_dtype"]) == ("bfloat16", "bfloat16")
