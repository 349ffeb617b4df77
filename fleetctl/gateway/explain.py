"""POST /fleet/route/explain: how the gateway would route a request, without sending it.

The answer names the class chosen and why, the prompt's size in tokens and blocks, the mode (P/D or whole,
with the fallback reason), every candidate engine with its score and the scorer's reason (ranked first,
then the ineligible ones with why), and the admission decision. Each engine row says whether the engine's KV
events hash prefixes as the gateway does (`prefix_hashes`: match, hash_mismatch or unchecked, hash_check.py).
Nothing is recorded: no share, no session.
"""

from __future__ import annotations

from typing import Any

from fleetctl.gateway.cross_node import CrossNodeFetch
from fleetctl.gateway.router import PD
from fleetctl.gateway.scorer import RankedEngine
from fleetctl.gateway.service import GatewayService, Prepared


def explain_body(prepared: Prepared, service: GatewayService) -> dict[str, Any]:
    plan = prepared.plan
    table = service.require_table()
    admission = plan.admission
    return {
        "model": prepared.model,
        "class_ref": prepared.class_ref,
        "traffic": dict(table.models[prepared.model].traffic),
        "context_window": prepared.spec.max_model_len,
        "num_prompt_tokens": len(prepared.prompt_ids),
        "num_blocks": len(prepared.block_hashes),
        "max_tokens": prepared.max_tokens,
        "mode": plan.mode,
        "fallback": plan.fallback,
        "candidates": ranked_rows(plan.candidates, "prefill" if plan.mode == PD else "whole", prepared, service),
        "decode_candidates": ranked_rows(plan.decode_candidates, "decode", prepared, service),
        "ineligible": ineligible_rows(prepared, service),
        "admission": None if admission is None else {
            "admit": admission.admit, "reason": admission.reason, "retry_after_s": admission.retry_after_s,
        },
        "cross_node": None if prepared.peer_fetch is None else cross_node_row(prepared.peer_fetch),
        "warm": None if prepared.warm is None else {  # the idle engine a real request would warm (explain sends none)
            "engine": prepared.warm.engine_id, "blocks": prepared.warm.blocks,
            "cached_blocks": prepared.warm.cached_blocks, "prefix_requests": round(prepared.warm.prefix_requests, 2)},
        "table_age_s": service.cache.age_s(),
    }


def cross_node_row(plan: CrossNodeFetch) -> dict[str, Any]:
    return {"engine": plan.engine, "fetch": plan.fetch, "peer": plan.peer, "peer_node": plan.peer_node,
            "blocks": plan.blocks, "gain_blocks": plan.gain_blocks, "with_s": round(plan.with_s, 6),
            "without_s": round(plan.without_s, 6), "bandwidth_bytes_per_s": round(plan.bandwidth_bytes_per_s),
            "measured": plan.measured, "reason": plan.reason}


def ranked_rows(ranked: list[RankedEngine], stage: str, prepared: Prepared, service: GatewayService) -> list[dict[str, Any]]:
    rows = []
    for rank, r in enumerate(ranked, 1):
        route = prepared.routes[r.engine_id]
        rows.append({
            "rank": rank, "stage": stage, "engine": r.engine_id, "role": route.role, "url": route.url,
            "score": round(r.score, 6), "cached_blocks": r.cached_blocks,
            "tier_blocks": dict(r.tier_blocks), "tier_fetch_s": round(r.fetch_s, 6),
            **load_fields(prepared, r.engine_id),
            "predicted_prefill_s": round(r.predicted_prefill_s, 6), "recent_share": round(r.recent_share, 4),
            "hot_spot_damped": r.hot_spot_damped, "sticky": r.sticky, "reason": r.reason,
            "prefix_hashes": service.hash_checks.status(r.engine_id),
        })
    return rows


def load_fields(prepared: Prepared, engine: str) -> dict[str, Any]:
    """The load the scorer saw on the engine: requests waiting and running, prompt tokens queued for prefill."""
    candidate = prepared.candidates.get(engine)
    if candidate is None:
        return {}
    view = candidate.view
    return {"num_waiting": view.num_waiting, "num_running": view.num_running,
            "queued_prefill_tokens": view.queued_prefill_tokens}


def ineligible_rows(prepared: Prepared, service: GatewayService) -> list[dict[str, Any]]:
    ranked = {r.engine_id for r in prepared.plan.candidates} | {r.engine_id for r in prepared.plan.decode_candidates}
    rows = []
    for name, route in sorted(prepared.routes.items()):
        if name in ranked:
            continue
        live = service.engines.get(name)
        if live is None:
            why = f"state {route.state}"
        elif not live.healthy:
            why = f"down: {live.down_reason}"
        else:
            why = f"role {route.role} not used in mode {prepared.plan.mode}"
        rows.append({"engine": name, "role": route.role, "url": route.url, "why": why,
                     "prefix_hashes": service.hash_checks.status(name)})
    return rows
