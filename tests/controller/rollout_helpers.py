"""Helpers for the rollout tests: a model served by chat@r1 on one node, a simulated agent that reports every
assigned engine ready (and drained ones gone), a simulated gateway that applies and acknowledges the routing
table, and the API calls of rollouts."""

from __future__ import annotations

from typing import Any

from ctl_helpers import Api, apply_class, beat, deploy, observed, register

MODEL = "smollm2-135m"
R1, R2 = "chat@r1", "chat@r2"
STEPS = [{"scale": {}}, {"setWeight": 50}, {"pause": {"duration": "10s"}}, {"setWeight": 100}]


class Agent:
    """One node's agent: each `settle` takes the assignment and reports its engines ready (drained ones as
    gone, as an agent does once it stopped them)."""

    def __init__(self, api: Api, node: str = "n1", engines: int = 8):
        self.api, self.node, self.generation = api, node, 0
        self.engines: list[dict[str, Any]] = []
        self.reported: dict[str, dict[str, Any]] = {}  # class_ref -> what its engines report of their config
        register(api, node, engines=engines)

    def settle(self) -> None:
        for _ in range(2):  # learn the assignment, then report it applied
            reply = beat(self.api, self.node, self.generation, self.engines)
            self.generation = reply["generation"]
            self.engines = [self._observed(a) for a in reply["assignment"] if not a["drain"]]

    def _observed(self, assignment: dict[str, Any]) -> dict[str, Any]:
        engine = observed(assignment, "ready")
        if assignment["class_ref"] in self.reported:
            engine["reported"] = self.reported[assignment["class_ref"]]
        return engine


class Gateway:
    """A gateway that refreshes its routing table and reports the generation it applied."""

    def __init__(self, api: Api, name: str = "gw-1"):
        self.api, self.name = api, name

    def refresh(self) -> int:
        generation = self.api.call("GET", "/api/v1/routing", role="viewer").json()["generation"]
        body = {"name": self.name, "url": None, "generation": generation, "table_age_s": 0.0, "refresh_interval_s": 2.0}
        assert self.api.call("POST", "/api/v1/gateways/report", role="viewer", json=body).status_code == 200
        return generation


def served_by_r1(api: Api, policy: bool = True, **r2: Any) -> Agent:
    """chat@r1 deployed (one engine, ready) holding all of MODEL's traffic (a stored policy, unless not
    `policy`: then only because it is the one deployed revision); chat@r2 applied (`r2`: its spec's
    differences, performance-only by default)."""
    agent = Agent(api)
    apply_class(api)
    apply_class(api, **(r2 or {"max_num_seqs": 128}))
    deploy(api, "chat", R1, 1)
    api.reconcile()
    agent.settle()
    if policy:
        response = api.call("PUT", f"/api/v1/traffic/{MODEL}", role="operator", json={"weights": {R1: 100}})
        assert response.status_code == 200, response.text
    return agent


def spec(**changes: Any) -> dict[str, Any]:
    return {"model": MODEL, "to": R2, "steps": STEPS, **changes}


def start(api: Api, body_spec: dict[str, Any], reason: str | None = "test rollout") -> Any:
    return api.call("POST", "/api/v1/rollouts", role="operator", json={"spec": body_spec, "reason": reason})


def command(api: Api, rollout_id: int, verb: str, role: str = "operator", **body: Any) -> Any:
    return api.call("POST", f"/api/v1/rollouts/{rollout_id}/{verb}", role=role, json=body or None,
                    headers={"X-Fleet-Reason": f"test {verb}"})


def show(api: Api, rollout_id: int) -> dict[str, Any]:
    response = api.call("GET", f"/api/v1/rollouts/{rollout_id}", role="viewer")
    assert response.status_code == 200, response.text
    return response.json()


def rollouts(api: Api, **params: Any) -> list[dict[str, Any]]:
    response = api.call("GET", "/api/v1/rollouts", role="viewer", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def history(api: Api, rollout_id: int) -> list[str]:
    response = api.call("GET", f"/api/v1/rollouts/{rollout_id}/history", role="viewer")
    assert response.status_code == 200, response.text
    return [event["event"] for event in response.json()]


def audit_actions(api: Api) -> list[tuple[str, str, str | None]]:
    return [(e["action"], e["result"], e["code"]) for e in api.call("GET", "/api/v1/audit", role="viewer").json()
            if e["action"].startswith("rollout")]


def weights(api: Api) -> dict[str, float]:
    return api.call("GET", f"/api/v1/traffic/{MODEL}", role="viewer").json()["weights"]


def replicas(api: Api) -> dict[str, int]:
    return {d["name"]: d["replicas"] for d in api.call("GET", "/api/v1/deployments", role="viewer").json()}


def tick(api: Api, agent: Agent, gateway: Gateway | None, seconds: float = 1.0, rollout_id: int = 1) -> dict[str, Any]:
    """Time passes; the controller reconciles; the agent and the gateway catch up. The rollout, after."""
    api.clock.advance(seconds)
    api.reconcile()
    agent.settle()
    if gateway is not None:
        gateway.refresh()
    api.reconcile()
    return show(api, rollout_id)
