"""What an agent reports is bounded before it is stored: a PID that is no PID, a count past its column, a
metric that is not a finite non-negative number or a string wider than its column is a 422 naming the field,
and nothing is written. Extra metric figures within bounds pass through to the routing table."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ctl_helpers import Api, apply_class, beat, deploy, observed, register
from test_validation_api import assert_refused, row_counts

from engine.contract import fields
from engine.contract.bounds import INT32_MAX
from engine.contract.observed import MAX_EXTRA_METRICS
from fleetctl.controller.models import Engine

HEARTBEAT = "/api/v1/agents/heartbeat"


def reported(**changes: Any) -> dict[str, Any]:
    engine = observed({"name": "chat-0", "model": "smollm2-135m", "class_ref": "chat@r1", "role": "mixed"}, "ready")
    metrics = changes.pop("metrics", {})
    return {**engine, **changes, "metrics": {**engine["metrics"], **metrics}}


BAD_ENGINES = [
    (reported(pid=100000000000000000000000), "engines.0.pid"),
    (reported(pid=0), "engines.0.pid"),
    (reported(port=70000), "engines.0.port"),
    (reported(restarts=INT32_MAX + 1), "engines.0.restarts"),
    (reported(restarts=-1), "engines.0.restarts"),
    (reported(name="e" * (fields.ENGINE_NAME_MAX + 1)), "engines.0.name"),
    (reported(model="m" * (fields.MODEL_NAME_MAX + 1)), "engines.0.model"),
    (reported(class_ref="c" * (fields.CLASS_REF_MAX + 1)), "engines.0.class_ref"),
    (reported(url="http://" + "u" * fields.ENDPOINT_MAX), "engines.0.url"),
    (reported(kv_events_endpoint="tcp://" + "k" * fields.ENDPOINT_MAX), "engines.0.kv_events_endpoint"),
    (reported(last_exit="x" * (fields.LAST_EXIT_MAX + 1)), "engines.0.last_exit"),
    (reported(last_exit="exit\x001"), "engines.0.last_exit"),
    (reported(state="sleeping"), "engines.0.state"),
    (reported(metrics={"num_requests_running": -1}), "engines.0.metrics.num_requests_running"),
    (reported(metrics={"kv_cache_usage_perc": 1.5}), "engines.0.metrics.kv_cache_usage_perc"),
    (reported(metrics={"spec_decode_accepted": -2}), "engines.0.metrics.spec_decode_accepted"),
    (reported(metrics={"spec_decode_accepted": "many"}), "engines.0.metrics.spec_decode_accepted"),
    (reported(metrics={"bad name!": 1}), "engines.0.metrics"),
    (reported(metrics={"m" * 101: 1}), "engines.0.metrics"),
    (reported(metrics={f"extra_{i}": 1 for i in range(MAX_EXTRA_METRICS + 1)}), "engines.0.metrics"),
]


@pytest.mark.parametrize(("engine", "field"), BAD_ENGINES)
def test_an_out_of_bounds_report_is_refused_naming_the_field(api: Api, engine: dict[str, Any], field: str) -> None:
    register(api, "n1")
    before = row_counts(api)
    response = api.call("POST", HEARTBEAT, role="agent", json={"node": "n1", "generation": 0, "engines": [engine]})
    assert_refused(api, response, 422, field, before)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_metric_is_refused(api: Api, value: str) -> None:
    register(api, "n1")
    before = row_counts(api)
    body = json.dumps({"node": "n1", "generation": 0, "engines": [reported()]})
    body = body.replace('"num_requests_waiting": 0', f'"num_requests_waiting": {value}')
    response = api.call("POST", HEARTBEAT, role="agent", content=body, headers={"content-type": "application/json"})
    assert_refused(api, response, 422, "engines.0.metrics.num_requests_waiting", before)


def test_extra_metrics_within_bounds_reach_the_routing_table(api: Api) -> None:
    register(api, "n1")
    deploy(api, "chat", apply_class(api)["ref"], 1)
    api.reconcile()
    reply = beat(api, "n1")
    engine = observed(reply["assignment"][0], "ready")
    engine["metrics"] |= {"vllm:spec_decode_num_accepted_tokens": 12.0, "gpu_util": 0.5}
    beat(api, "n1", reply["generation"], [engine])
    (routed,) = api.call("GET", "/api/v1/routing", role="viewer").json()["engines"]
    assert routed["metrics"]["vllm:spec_decode_num_accepted_tokens"] == 12.0
    assert routed["metrics"]["gpu_util"] == 0.5


def test_the_contract_widths_are_the_store_columns() -> None:
    columns = Engine.__table__.columns
    assert columns["name"].type.length == fields.ENGINE_NAME_MAX
    assert columns["model"].type.length == fields.MODEL_NAME_MAX
    assert columns["class_ref"].type.length == fields.CLASS_REF_MAX
    assert columns["url"].type.length == columns["kv_events_endpoint"].type.length == fields.ENDPOINT_MAX
