"""The routing decision for one request, once its class is chosen and its prompt tokenised: P/D or mixed,
the ranked engines, and admission. Pure: the service builds the candidates and acts on the plan.

P/D is used when the routing table marks the model `pd`, the flag `pd_disaggregation:<model>` is not off, and
the class has at least one healthy prefill AND one healthy decode engine. Otherwise the request is served
whole by one engine ("fallback"): the class's healthy mixed engines, or, if it has none, any healthy engine
of the class (prefill and decode engines can serve a whole request too).

- prefill engines (and mixed engines) are ranked by `rank_engines` on prefix locality and prefill load;
- decode engines are ranked on load alone (no locality: their prompt K/V arrives from the prefill engine),
  which the scorer prices as queued prefill work, waiting and running requests and KV pressure.

Admission (`admission.admit_on_predicted_load`) runs over the same healthy engines: a (prefill, decode)
pair per P/D combination, or each whole-request engine as its own pair.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleetctl.gateway.admission import (
    AdmissionDecision,
    AdmissionRequest,
    EngineLoad,
    ModelLoadSnapshot,
    ModelSLO,
    admit_on_predicted_load,
)
from fleetctl.flag_catalog import value_of
from fleetctl.gateway.scorer import EngineView, RankedEngine, RouteRequest, RoutingSnapshot, ScorerPolicy, rank_engines

MIXED, PD = "mixed", "pd"


@dataclass(frozen=True)
class Candidate:
    """One engine of the chosen class at decision time."""

    view: EngineView
    load: EngineLoad

    @property
    def name(self) -> str:
        return self.view.engine_id


@dataclass(frozen=True)
class RoutePlan:
    class_ref: str
    mode: str  # "pd" or "mixed"
    candidates: list[RankedEngine]  # whole-request engines (mixed mode) or prefill engines (pd), best first
    decode_candidates: list[RankedEngine] = field(default_factory=list)  # pd only
    fallback: str | None = None  # why a P/D model is served whole
    admission: AdmissionDecision | None = None  # None: admission is off

    @property
    def admitted(self) -> bool:
        return self.admission is None or self.admission.admit


def pd_disabled_by_flag(flags: Mapping[str, Any], model: str) -> bool:
    """The routing table's `pd_disaggregation:<model>` flag is off (fleetctl/flag_catalog.py)."""
    return not value_of(flags, "pd_disaggregation", model)


def scorer_policy(policy: ScorerPolicy, flags: Mapping[str, Any]) -> ScorerPolicy:
    """The policy the flags leave: `prefix_routing` off ranks on load alone (no locality bonus)."""
    return policy if value_of(flags, "prefix_routing") else replace(policy, locality_weight=0.0)


def choose_mode(model_pd: bool, flag_disabled: bool, candidates: Sequence[Candidate]) -> tuple[str, str | None]:
    """("pd", None), or ("mixed", why a P/D model is not served P/D now; None for a mixed model)."""
    if not model_pd:
        return MIXED, None
    if flag_disabled:
        return MIXED, "disabled by flag"
    healthy_roles = {c.view.role for c in candidates if c.view.healthy}
    if "prefill" not in healthy_roles:
        return MIXED, "no healthy prefill engine"
    if "decode" not in healthy_roles:
        return MIXED, "no healthy decode engine"
    return PD, None


def whole_request_roles(candidates: Sequence[Candidate]) -> frozenset[str] | None:
    """Mixed engines when the class has a healthy one, else any role."""
    if any(c.view.healthy and c.view.role == "mixed" for c in candidates):
        return frozenset({"mixed"})
    return None


def plan_route(
    request: RouteRequest,
    max_tokens: int,
    class_ref: str,
    mode_and_fallback: tuple[str, str | None],
    candidates: Sequence[Candidate],
    policy: ScorerPolicy,
    slo: ModelSLO | None,
    sessions: Mapping[str, str] | None = None,
) -> RoutePlan:
    """Rank the class's engines for the request and decide admission (None when `slo` is None).
    `sessions`: session id -> engine it last used (only the request's own entry matters)."""
    mode, fallback = mode_and_fallback
    request = replace(request, class_ref=class_ref)
    snapshot = RoutingSnapshot([c.view for c in candidates], dict(sessions or {}))
    healthy = [c for c in candidates if c.view.healthy]
    if mode == PD:
        prefill = rank_engines(replace(request, roles=frozenset({"prefill"})), snapshot, policy)
        decode_request = RouteRequest((), request.num_prompt_tokens, None, class_ref, frozenset({"decode"}))
        no_locality = [replace(v, cached_blocks=0, tier_blocks=()) for v in snapshot.engines]  # decode K/V comes from prefill
        decode = rank_engines(decode_request, RoutingSnapshot(no_locality), policy)
        loads = [c.load for c in healthy if c.view.role in ("prefill", "decode")]
        return RoutePlan(class_ref, PD, prefill, decode, None, _admit(request, max_tokens, loads, slo))
    roles = whole_request_roles(candidates)
    ranked = rank_engines(replace(request, roles=roles), snapshot, policy)
    loads = [replace(c.load, role="mixed") for c in healthy if roles is None or c.view.role in roles]
    return RoutePlan(class_ref, MIXED, ranked, [], fallback, _admit(request, max_tokens, loads, slo))


def _admit(request: RouteRequest, max_tokens: int, loads: list[EngineLoad], slo: ModelSLO | None) -> AdmissionDecision | None:
    if slo is None:
        return None
    admission_request = AdmissionRequest(num_prompt_tokens=request.num_prompt_tokens, max_tokens=max_tokens)
    return admit_on_predicted_load(admission_request, ModelLoadSnapshot(loads), slo)
