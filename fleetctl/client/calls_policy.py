"""The call table: traffic weights, feature flags, rollouts."""

from __future__ import annotations

from typing import Any

from fleetctl.client.endpoint import Request, endpoint, params_of
from engine.contract.direct import DirectUploadReply
from fleetctl.controller.responses import (
    DirectDivergence, FlagSetResult, FlagView, ReconcileResult, TrafficPolicyView, TrafficSetResult, TrafficView,
)
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
        """Every catalog flag by key (`NAME`, or `NAME:MODEL` for a per-model one that is overridden)."""
        return Request()

    @endpoint("GET", "/api/v1/flags/{key}", FlagView)
    def get_flag(key: str) -> Request:
        return Request(path={"key": key})

    @endpoint("PUT", "/api/v1/flags/{key}", FlagSetResult)
    def set_flag(key: str, value: bool | int | float | str, reason: str | None = None,
                 ttl_s: float | None = None) -> Request:
        """Override a catalog flag (a reason is required); `ttl_s`: it reverts to its default that long from
        now. The result's `generation` is the routing generation gateways apply it at."""
        body: dict[str, Any] = {"value": value}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        return Request(path={"key": key}, json=body, reason=reason)

    @endpoint("DELETE", "/api/v1/flags/{key}", FlagSetResult)
    def unset_flag(key: str, reason: str | None = None) -> Request:
        """Remove the override: the flag has its default again."""
        return Request(path={"key": key}, reason=reason)

    # break-glass (admin; a reason always)
    @endpoint("POST", "/api/v1/breakglass/freeze", FlagSetResult)
    def freeze(reason: str | None = None, ttl_s: float | None = None) -> Request:
        """The reconciler and every rollout stop changing the fleet until unfreeze (or `ttl_s`)."""
        return Request(json=_ttl({}, ttl_s), reason=reason)

    @endpoint("POST", "/api/v1/breakglass/unfreeze", FlagSetResult)
    def unfreeze(reason: str | None = None) -> Request:
        return Request(json={}, reason=reason)

    @endpoint("POST", "/api/v1/breakglass/pin/{model}", FlagSetResult)
    def pin_model(model: str, class_ref: str, reason: str | None = None, ttl_s: float | None = None) -> Request:
        """All of the model's traffic to `class_ref`, over weights, drills and rollouts, until unpinned."""
        return Request(path={"model": model}, json=_ttl({"class_ref": class_ref}, ttl_s), reason=reason)

    @endpoint("DELETE", "/api/v1/breakglass/pin/{model}", FlagSetResult)
    def unpin_model(model: str, reason: str | None = None) -> Request:
        return Request(path={"model": model}, reason=reason)

    @endpoint("POST", "/api/v1/breakglass/shed/{model}", FlagSetResult)
    def shed_model(model: str, fraction: float, reason: str | None = None, ttl_s: float | None = None) -> Request:
        """Gateways answer `fraction` of the model's requests 429 with Retry-After (0 stops shedding)."""
        return Request(path={"model": model}, json=_ttl({"fraction": fraction}, ttl_s), reason=reason)

    @endpoint("POST", "/api/v1/breakglass/kill-switch/{flag}", FlagSetResult)
    def kill_switch(flag: str, model: str | None = None, reason: str | None = None,
                    ttl_s: float | None = None) -> Request:
        """Turn a default-on flag off (`flag unset` turns it back on)."""
        return Request(path={"flag": flag}, json=_ttl({"model": model} if model else {}, ttl_s), reason=reason)

    # direct actions: uploaded by agents and gateways, reconciled by an admin
    @endpoint("POST", "/api/v1/breakglass/direct-actions", DirectUploadReply)
    def upload_direct_actions(payload: dict[str, Any]) -> Request:
        """A node's new direct-action journal entries and its open holds (engine.contract.direct.DirectUpload)."""
        return Request(json=payload)

    @endpoint("GET", "/api/v1/breakglass/divergence", list[DirectDivergence])
    def divergence(all: bool = False) -> Request:
        """Open direct actions desired state does not agree with (`all`: every uploaded one)."""
        return Request(params=params_of(all=all or None))

    @endpoint("POST", "/api/v1/breakglass/reconcile", ReconcileResult)
    def reconcile(adopt: list[int] | None = None, revert: list[int] | None = None,
                  reason: str | None = None) -> Request:
        """Adopt (desired state takes it over) or revert (the node undoes it) direct actions by id."""
        return Request(json={"adopt": adopt or [], "revert": revert or []}, reason=reason)

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


def _ttl(body: dict[str, Any], ttl_s: float | None) -> dict[str, Any]:
    return {**body, "ttl_s": ttl_s} if ttl_s is not None else body
