"""Helpers shared by the controller tests: the Api wrapper, a settable clock, agent-side calls."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from fastapi.testclient import TestClient

from fleetctl.controller.runtime import ControllerRuntime

SPEC = {"model": "smollm2-135m", "weights": "smollm2"}


class Clock:
    """A settable clock for the runtime: heartbeat ages and 'down' decisions without sleeping."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class Api:
    """A TestClient on a started controller, with a token per role."""

    http: TestClient
    runtime: ControllerRuntime
    tokens: dict[str, str]
    clock: Clock

    def call(self, method: str, path: str, role: str | None = "admin", **kwargs: Any) -> Any:
        headers = dict(kwargs.pop("headers", {}) or {})
        if role is not None:
            headers["Authorization"] = f"Bearer {self.tokens[role]}"
        return self.http.request(method, path, headers=headers, **kwargs)

    def reconcile(self) -> Any:
        return self.runtime.step()


def register(api: Api, node: str, engines: int = 4, labels: dict[str, str] | None = None) -> dict[str, Any]:
    body = {"node": node, "url": f"http://{node}:9000", "labels": labels or {},
            "capacity": {"engines": engines, "kv_mib": 1024}, "agent_version": "test"}
    response = api.call("POST", "/api/v1/agents/register", role="agent", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def beat(api: Api, node: str, generation: int = 0, engines: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body = {"node": node, "generation": generation, "engines": engines or [], "cut_off_s": None}
    response = api.call("POST", "/api/v1/agents/heartbeat", role="agent", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def observed(assignment: dict[str, Any], state: str) -> dict[str, Any]:
    """What an agent would report for an assigned engine in `state`."""
    return {"name": assignment["name"], "model": assignment["model"], "class_ref": assignment["class_ref"],
            "role": assignment["role"], "state": state, "pid": 4242, "port": 8100, "url": "http://127.0.0.1:8100",
            "kv_events_endpoint": None, "restarts": 0, "last_exit": None,
            "metrics": {"num_requests_running": 1, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.25,
                        "prefix_cache_queries": 10, "prefix_cache_hits": 5}}


def apply_class(api: Api, name: str = "chat", **spec: Any) -> dict[str, Any]:
    response = api.call("POST", "/api/v1/classes", role="operator", json={"name": name, "spec": {**SPEC, **spec}})
    assert response.status_code in (200, 201), response.text
    return response.json()


def deploy(api: Api, name: str, class_ref: str, replicas: int, **extra: Any) -> dict[str, Any]:
    response = api.call("PUT", f"/api/v1/deployments/{name}", role="operator",
                        json={"class_ref": class_ref, "replicas": replicas, **extra})
    assert response.status_code in (200, 201), response.text
    return response.json()
