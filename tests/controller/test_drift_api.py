"""Live drift through the API, on SQLite and PostgreSQL: agents' heartbeats carry what each engine was
launched with and what it reports; the controller stores it (secrets redacted), compares it with the class
revision, and shows it in GET /api/v1/drift, the engine views, status, /metrics and `drifted_engines`."""

from __future__ import annotations

from typing import Any

from ctl_helpers import Api, apply_class, beat, deploy, observed, register

from engine.contract.launched import ARGV_MAX, REDACTED
from engine.contract.prometheus import parse_samples, sum_series
from fleetctl.controller.drift import drifted_engines
from fleetctl.controller.models import Engine

SPEC = {"model": "tiny", "weights": "tiny", "dtype": "float32", "kv_cache_dtype": "float32"}


def launched(kv_dtype: str = "float32") -> dict[str, Any]:
    argv = ["python", "-m", "engine.reference", "--model", "tiny", "--served-model-name", "tiny",
            "--dtype", "float32", "--kv-cache-dtype", kv_dtype]
    return {"argv": argv, "env": {"PYTHONPATH": "/src", "HF_TOKEN": "hf_s3cret"}}


def reported(kv_dtype: str = "float32") -> dict[str, Any]:
    return {"source": "reference", "version": "0.1.0",
            "settings": {"model": "tiny", "dtype": "float32", "kv_cache_dtype": kv_dtype, "max_model_len": 2048}}


def two_engines(api: Api) -> list[dict[str, Any]]:
    """A class tiny@r1 (float32 KV) with two engines on n1, as the agent would report them, unreported yet."""
    register(api, "n1")
    apply_class(api, "tiny", **SPEC)
    deploy(api, "tiny", "tiny@r1", 2)
    api.reconcile()
    return beat(api, "n1")["assignment"]


def report(api: Api, assignment: list[dict[str, Any]], **per_engine: dict[str, Any]) -> None:
    engines = [{**observed(a, "ready"), **per_engine.get(a["name"].replace("-", "_"), {})} for a in assignment]
    beat(api, "n1", 1, engines)


def get(api: Api, path: str, **params: Any) -> Any:
    response = api.call("GET", path, role="viewer", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_drifted_engine_is_named_with_each_difference_and_its_source(api: Api) -> None:
    assignment = two_engines(api)
    report(api, assignment, tiny_0={"launched": launched("bfloat16"), "reported": reported("bfloat16")},
           tiny_1={"launched": launched(), "reported": reported()})

    by_name = {e["name"]: e for e in get(api, "/api/v1/drift", model="tiny")}
    assert by_name["tiny-0"]["drifted"] is True and by_name["tiny-1"]["drifted"] is False
    assert by_name["tiny-0"]["drift"] == [
        {"field": "kv_cache_dtype", "declared": "float32", "actual": "bfloat16", "source": "engine"},
        {"field": "kv_cache_dtype", "declared": "float32", "actual": "bfloat16", "source": "launch"},
    ]
    assert by_name["tiny-0"]["checked"] == ["engine", "launch"] and by_name["tiny-0"]["class_ref"] == "tiny@r1"
    assert get(api, "/api/v1/drift", model="other") == []

    engines = {e["name"]: e for e in get(api, "/api/v1/engines")}
    assert [d["field"] for d in engines["tiny-0"]["drift"]] == ["kv_cache_dtype", "kv_cache_dtype"]
    assert engines["tiny-1"]["drift"] == []
    assert get(api, "/api/v1/status")["drifted"] == 1
    with api.runtime.store.session() as session:
        assert drifted_engines(session) == {"tiny@r1": ("tiny-0",)}
        assert drifted_engines(session, model="other") == {}


def test_the_metric_is_1_for_a_drifted_engine_and_0_for_one_that_matches(api: Api) -> None:
    assignment = two_engines(api)
    report(api, assignment, tiny_0={"reported": reported("bfloat16")}, tiny_1={"launched": launched()})
    samples = parse_samples(api.call("GET", "/metrics", role=None).text)
    assert sum_series(samples, "fleet_engine_config_drift", engine="tiny-0", class_ref="tiny@r1") == 1.0
    assert [s.labels["engine"] for s in samples["fleet_engine_config_drift"]] == ["tiny-0", "tiny-1"]
    assert sum_series(samples, "fleet_engine_config_drift", engine="tiny-1") == 0.0

    report(api, assignment, tiny_0={"reported": reported()}, tiny_1={"launched": launched()})  # fixed
    samples = parse_samples(api.call("GET", "/metrics", role=None).text)
    assert sum_series(samples, "fleet_engine_config_drift") == 0.0


def test_an_older_agent_that_reports_neither_is_not_drift_and_has_no_series(api: Api) -> None:
    assignment = two_engines(api)
    report(api, assignment)
    assert all(e["checked"] == [] and not e["drifted"] for e in get(api, "/api/v1/drift"))
    assert "fleet_engine_config_drift{" not in api.call("GET", "/metrics", role=None).text
    assert get(api, "/api/v1/status")["drifted"] == 0


def test_an_engine_that_no_longer_runs_is_not_checked(api: Api) -> None:
    assignment = two_engines(api)
    report(api, assignment, tiny_0={"state": "failed", "pid": None, "reported": reported("bfloat16")})
    assert [e["name"] for e in get(api, "/api/v1/drift")] == ["tiny-1"]


def test_secrets_in_a_reported_launch_are_stored_redacted(api: Api) -> None:
    assignment = two_engines(api)
    leaky = {"argv": [*launched()["argv"], "--api-key", "k3y"], "env": {"HF_TOKEN": "hf_s3cret", "A": "b"}}
    report(api, assignment, tiny_0={"launched": leaky})
    api.runtime.flush_heartbeats()
    with api.runtime.store.session() as session:
        row = session.get(Engine, ("n1", "tiny-0"))
        assert row.launched["env"] == {"HF_TOKEN": REDACTED, "A": "b"}
        assert row.launched["argv"][-2:] == ["--api-key", REDACTED]
    assert "s3cret" not in str(get(api, "/api/v1/engines")) and "k3y" not in str(get(api, "/api/v1/drift"))


def test_an_unbounded_launch_is_refused_naming_the_field(api: Api) -> None:
    assignment = two_engines(api)
    engine = {**observed(assignment[0], "ready"), "launched": {"argv": ["x"] * (ARGV_MAX + 1), "env": {}}}
    response = api.call("POST", "/api/v1/agents/heartbeat", role="agent",
                        json={"node": "n1", "generation": 1, "engines": [engine], "cut_off_s": None})
    assert response.status_code == 422
    assert "engines.0.launched.argv" in response.json()["error"]["field"]
