"""The rollout API as the process tests drive it: raw HTTP (so a test sees status codes and error bodies),
specs built from a few parameters, and waits on a rollout's phase and step.

    POST /api/v1/rollouts {spec, reason}           -> 201 RolloutView | 409 (one per model) | 422 (bad spec)
    GET  /api/v1/rollouts/{id}                     -> RolloutView
    GET  /api/v1/rollouts/{id}/history             -> [RolloutEventView]
    POST /api/v1/rollouts/{id}/{verb} {reason}     -> RolloutView   (pause|resume|promote|abort|retry|undo)
"""

from __future__ import annotations

from typing import Any

import pytest

from rollout_fleet import MODEL, RolloutFleet, wait_until

TERMINAL = ("completed", "aborted")
INCONCLUSIVE = "InconclusiveAnalysisRun"


def make_steps(*steps: Any) -> list[dict[str, Any]]:
    """Steps from short forms: an int is setWeight, "scale" a scale step, ("pause", "2s" | None) a pause,
    ("analysis", [templates]) an inline analysis."""
    out: list[dict[str, Any]] = []
    for step in steps:
        if isinstance(step, int):
            out.append({"setWeight": step})
        elif step == "scale":
            out.append({"scale": {}})
        elif step[0] == "pause":
            out.append({"pause": {} if step[1] is None else {"duration": step[1]}})
        elif step[0] == "analysis":
            out.append({"analysis": {"templates": list(step[1])}})
        else:
            raise ValueError(f"unknown step {step!r}")
    return out


# Short windows so a test's analysis decides in seconds: three 1-second measurements of B's median TTFT
# against A's, each needing a few requests from both, after B's fresh engines had two seconds to warm up.
# The median and one tolerated failure keep a healthy B passing on a busy shared machine (a p90 of one
# second's requests moves with every stall of a neighbour); a slow B fails every window by far.
def latency_template(factor: float = 3.0, min_requests: int = 3, initial_delay: str = "2s",
                     interval: str = "1s") -> dict[str, Any]:
    return {"metrics": [{"name": "ttft", "measure": "ttft_p50_s", "successCondition": f"result <= {factor} * baseline",
                         "interval": interval, "count": 3, "failureLimit": 1, "minRequests": min_requests,
                         "initialDelay": initial_delay}]}


def errors_template(min_requests: int = 2) -> dict[str, Any]:
    """Background: measured every second for as long as the rollout runs (no count)."""
    return {"metrics": [{"name": "errors", "measure": "error_rate", "successCondition": "result <= 0",
                         "interval": "1s", "failureLimit": 0, "inconclusiveLimit": 3, "minRequests": min_requests}]}


def spec(to: str, steps: list[dict[str, Any]], templates: dict[str, Any] | None = None,
         replicas: int | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "to": to, "steps": steps, **extra}
    if templates:
        body["templates"] = templates
    if replicas is not None:
        body["replicas"] = replicas
    return body


def start(fleet: RolloutFleet, body: dict[str, Any], reason: str = "rollout test") -> dict[str, Any]:
    response = fleet.http("POST", "/api/v1/rollouts", {"spec": body, "reason": reason})
    assert response.status_code in (200, 201), response.text
    return response.json()


def get(fleet: RolloutFleet, rollout_id: int) -> dict[str, Any]:
    response = fleet.http("GET", f"/api/v1/rollouts/{rollout_id}")
    assert response.status_code == 200, response.text
    return response.json()


def list_all(fleet: RolloutFleet) -> list[dict[str, Any]]:
    response = fleet.http("GET", "/api/v1/rollouts")
    assert response.status_code == 200, response.text
    return response.json()


def rollout_ids(fleet: RolloutFleet) -> list[int]:
    return [r["id"] for r in list_all(fleet)]


def history(fleet: RolloutFleet, rollout_id: int) -> list[dict[str, Any]]:
    response = fleet.http("GET", f"/api/v1/rollouts/{rollout_id}/history")
    assert response.status_code == 200, response.text
    return response.json()


def command(fleet: RolloutFleet, rollout_id: int, verb: str, reason: str = "rollout test", **extra: Any) -> dict[str, Any]:
    response = fleet.http("POST", f"/api/v1/rollouts/{rollout_id}/{verb}", {"reason": reason, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def wait_phase(fleet: RolloutFleet, rollout_id: int, phases: str | tuple[str, ...], timeout_s: float = 120.0,
               step_index: int | None = None) -> dict[str, Any]:
    """Poll until the rollout is in one of `phases` (and at `step_index`, when given); fail early on an
    unexpected terminal phase."""
    wanted = (phases,) if isinstance(phases, str) else phases
    last: dict[str, Any] = {}

    def probe() -> dict[str, Any] | None:
        try:
            view = get(fleet, rollout_id)
        except AssertionError:
            return None  # the controller restarting: ask again
        last["view"] = view
        if view["phase"] in TERMINAL and view["phase"] not in wanted:
            raise AssertionError(f"rollout {rollout_id} ended {view['phase']}: {summary(view)}")
        if view["pause_reason"] == INCONCLUSIVE and "paused" not in wanted:  # it would wait for an operator
            raise AssertionError(f"rollout {rollout_id} paused, analysis inconclusive: {summary(view)}")
        if view["phase"] in wanted and (step_index is None or view["step_index"] == step_index):
            return view
        return None

    what = f"rollout {rollout_id} {'/'.join(wanted)}" + ("" if step_index is None else f" at step {step_index}")
    try:
        return wait_until(probe, timeout_s, what, every_s=0.3)
    except pytest.fail.Exception:
        pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {summary(last.get('view'))}")


def summary(view: dict[str, Any] | None) -> str:
    """The parts of a rollout view that say why it is where it is, for a failure message."""
    if view is None:
        return "no answer"
    gates = [(g["metric"], g["phase"], (g.get("latest") or {}).get("message")) for g in view["gates"]]
    keys = ("phase", "step_index", "pause_reason", "abort_reason", "message", "weights", "acknowledged", "ready",
            "desired")
    return f"{ {k: view.get(k) for k in keys} } gates {gates}"


def step_starts(events: list[dict[str, Any]]) -> list[int]:
    """The step index of every `step_started` event of a history ("step 2 (pause 3s) started"), in order."""
    return [int(e["message"].split()[1]) for e in events if e["event"] == "step_started"]


def wait_acknowledged_on(fleet: RolloutFleet, weights: dict[str, float], timeout_s: float = 30.0) -> None:
    """The stored policy is `weights` (zero weights ignored) and the gateway routes on it."""
    wait_until(lambda: fleet.weights() == weights and fleet.gateway_applied(), timeout_s,
               f"traffic {weights} acknowledged by the gateway")
