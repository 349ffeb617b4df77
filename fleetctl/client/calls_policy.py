"""The call table: traffic weights, feature flags, rollouts."""

from __future__ import annotations

from typing import Any

from fleetctl.client.endpoint import Request, endpoint, params_of
from fleetctl.controller.responses import FlagSetResult, FlagView, TrafficPolicyView, TrafficSetResult, TrafficView
from fleetctl.controller.rollout.view import RolloutEventView, RolloutView


class PolicyCalls:
    """Traffic weights, feature flags, rollouts."""

    # traffic and flags
    @endpoint("GET", "/api/v1/traffic", dict[str, TrafficPolicyView])
    def list_traffic() -> Request:
        return Request()

    @endpoint("GET", "/api/v1/traffic/{model}", TrafficView)
    def get_traffic(model: str) -> Request:
        """The model's weights and, per revision, ready engines and correctness fields."""
        return Request(path={"model": model})

    @endpoint("PUT", "/api/v1/traffic/{model}", TrafficSetResult)
    def set_traffic(model: str, weights: dict[str, float], allow_correctness_change: bool = False,
                    reason: str | None = None) -> Request:
        """Stored weights and the routing `generation` that includes them. A split over revisions whose
        correctness fields differ is a Conflict (`correctness_split_refused`) unless allowed."""
        body = {"weights": weights, "allow_correctness_change": allow_correctness_change}
        return Request(path={"model": model}, json=body, reason=reason)

    @endpoint("GET", "/api/v1/flags", dict[str, FlagView])
    def list_flags() -> Request:
        return Request()

    @endpoint("PUT", "/api/v1/flags/{name}", FlagSetResult)
    def set_flag(name: str, value: bool | int | float | str, reason: str | None = None) -> Request:
        return Request(path={"name": name}, json={"value": value}, reason=reason)

    # rollouts
    @endpoint("POST", "/api/v1/rollouts", RolloutView)
    def start_rollout(spec: dict[str, Any], reason: str | None = None) -> Request:
        """Store a rollout (the spec as YAML would hold it, aliases as written); a bad spec is a
        ValidationFailed naming the field (`spec.steps.1.setWeight`), a second one for the model a Conflict
        (`rollout_in_progress`)."""
        return Request(json={"spec": spec}, reason=reason)

    @endpoint("GET", "/api/v1/rollouts", list[RolloutView])
    def list_rollouts(model: str | None = None, active: bool | None = None) -> Request:
        """Oldest first; `active`: only rollouts that are not completed or aborted."""
        return Request(params=params_of(model=model, active=None if active is None else str(active).lower()))

    @endpoint("GET", "/api/v1/rollouts/{rollout_id}", RolloutView)
    def get_rollout(rollout_id: int) -> Request:
        return Request(path={"rollout_id": str(rollout_id)})

    @endpoint("POST", "/api/v1/rollouts/{rollout_id}/{command}", RolloutView)
    def rollout_command(rollout_id: int, command: str, full: bool = False, reason: str | None = None,
                        version: int | None = None) -> Request:
        """pause | resume | promote (`full`) | abort | retry: the rollout after it; undo: the new rollout.
        `version` is sent as If-Match (a Conflict `version_conflict` when the rollout moved on)."""
        body = {"full": True} if full else None
        return Request(path={"rollout_id": str(rollout_id), "command": command}, json=body, reason=reason,
                       if_match=version)

    @endpoint("GET", "/api/v1/rollouts/{rollout_id}/history", list[RolloutEventView])
    def rollout_history(rollout_id: int) -> Request:
        return Request(path={"rollout_id": str(rollout_id)})
