"""The call table: P:D status and the planner's advice, its settings, engine profiles, rebalances."""

from __future__ import annotations

from typing import Any

from fleetctl.client.endpoint import Request, endpoint, params_of
from fleetctl.controller.pd_responses import PdModelView, PdProfileView, RebalanceStarted, RebalanceView


class PdCalls:
    """P:D status, planner settings, profiles, rebalances."""

    @endpoint("GET", "/api/v1/pd/models", list[PdModelView])
    def pd_status(model: str | None = None) -> Request:
        """Each model's ratio, engines, planner recommendation (with its reasons) and rebalance under way; a
        model with no deployment is NotFound."""
        return Request(params=params_of(model=model))

    @endpoint("POST", "/api/v1/pd/models/{model}/rebalance", RebalanceStarted)
    def pd_rebalance(model: str, prefill: int, decode: int, mixed: int | None = None, apply: bool = False,
                     floor_prefill: int | None = None, floor_decode: int | None = None,
                     ttft_slo_s: float | None = None, itl_slo_s: float | None = None,
                     baseline_s: float | None = None, reason: str | None = None) -> Request:
        """The preview (flips in order, expected effect); with `apply`, the rebalance stored too. A target
        below a floor or with another engine count is a ValidationFailed naming the role; a frozen fleet,
        a running rollout or rebalance a Conflict."""
        body: dict[str, Any] = {"prefill": prefill, "decode": decode, "apply": apply}
        optional = {"mixed": mixed, "floor_prefill": floor_prefill, "floor_decode": floor_decode,
                    "ttft_slo_s": ttft_slo_s, "itl_slo_s": itl_slo_s, "baseline_s": baseline_s}
        body.update({k: v for k, v in optional.items() if v is not None})
        return Request(path={"model": model}, json=body, reason=reason)

    @endpoint("GET", "/api/v1/pd/rebalances", list[RebalanceView])
    def list_rebalances(model: str | None = None) -> Request:
        """Newest first."""
        return Request(params=params_of(model=model))

    @endpoint("GET", "/api/v1/pd/rebalances/{rebalance_id}", RebalanceView)
    def get_rebalance(rebalance_id: int) -> Request:
        """With its flips and history."""
        return Request(path={"rebalance_id": str(rebalance_id)})

    @endpoint("POST", "/api/v1/pd/rebalances/{rebalance_id}/stop", RebalanceView)
    def stop_rebalance(rebalance_id: int, reason: str | None = None) -> Request:
        """It stops after the flip in progress (the ratio stays whole)."""
        return Request(path={"rebalance_id": str(rebalance_id)}, reason=reason)

    @endpoint("PUT", "/api/v1/pd/models/{model}/settings", PdModelView)
    def pd_settings(model: str, mode: str | None = None, floor_prefill: int | None = None,
                    floor_decode: int | None = None, ttft_slo_s: float | None = None, itl_slo_s: float | None = None,
                    headroom: float | None = None, reason: str | None = None, cooldown_s: float | None = None,
                    dwell_s: float | None = None) -> Request:
        """Set the planner's mode (off | advisory | auto), floors, SLOs, headroom, cooldown or dwell for a model."""
        given = {"mode": mode, "floor_prefill": floor_prefill, "floor_decode": floor_decode,
                 "ttft_slo_s": ttft_slo_s, "itl_slo_s": itl_slo_s, "headroom": headroom, "cooldown_s": cooldown_s,
                 "dwell_s": dwell_s}
        return Request(path={"model": model}, json={k: v for k, v in given.items() if v is not None}, reason=reason)

    @endpoint("PUT", "/api/v1/pd/profiles/{class_ref}", PdProfileView)
    def set_pd_profile(class_ref: str, prefill_tokens_per_s: float, decode_slots: float,
                       detail: dict[str, Any] | None = None, reason: str | None = None,
                       decode_itl_s: float | None = None) -> Request:
        """Store what one engine of the class revision does (`fleetctl pd profile`)."""
        body = {"prefill_tokens_per_s": prefill_tokens_per_s, "decode_slots": decode_slots, "detail": detail or {}}
        if decode_itl_s is not None:
            body["decode_itl_s"] = decode_itl_s
        return Request(path={"class_ref": class_ref}, json=body, reason=reason)

    @endpoint("GET", "/api/v1/pd/profiles", list[PdProfileView])
    def list_pd_profiles() -> Request:
        return Request()
