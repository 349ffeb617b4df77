"""Admission policies for the simulator: each is a pure function of (request, fleet snapshot) -> `Placement`.

- `predicted_policy(slo)`: the live gateway's `admit_on_predicted_load`; an admitted request goes to the
  (prefill, decode) pair the prediction chose.
- `observed_policy(thresholds)`: the baseline `admit_on_observed_load`; routed to the least loaded of the
  engines under the thresholds.
- `admit_all_policy()`: admission off, least loaded routing; gives the scale of the overload.

Least loaded: the prefill engine with the fewest queued prompt tokens, the decode engine with the fewest
running plus admitted-ahead requests; ties go to the lower engine id (as strings).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fleetctl.gateway.admission import (
    AdmissionDecision,
    AdmissionRequest,
    EngineLoad,
    ModelLoadSnapshot,
    ModelSLO,
    ObservedLoadThresholds,
    admit_on_observed_load,
    admit_on_predicted_load,
)


@dataclass(frozen=True)
class Placement:
    """Admission's decision and, when it admits, where the request goes."""

    decision: AdmissionDecision
    prefill_engine: str | None = None
    decode_engine: str | None = None


Policy = Callable[[AdmissionRequest, ModelLoadSnapshot], Placement]


def predicted_policy(slo: ModelSLO) -> Policy:
    def decide(request: AdmissionRequest, snapshot: ModelLoadSnapshot) -> Placement:
        decision = admit_on_predicted_load(request, snapshot, slo)
        if not decision.admit or decision.prediction is None:
            return Placement(decision)
        return Placement(decision, decision.prediction.prefill_engine, decision.prediction.decode_engine)

    return decide


def observed_policy(thresholds: ObservedLoadThresholds) -> Policy:
    def decide(request: AdmissionRequest, snapshot: ModelLoadSnapshot) -> Placement:
        decision = admit_on_observed_load(snapshot, thresholds)
        if not decision.admit:
            return Placement(decision)
        prefill = [e for e in snapshot.engines if e.role == "prefill" and e.admitted_ahead < thresholds.max_waiting]
        decode = [e for e in snapshot.engines
                  if e.role == "decode" and len(e.running) < thresholds.max_running_fraction * e.max_num_seqs]
        return Placement(decision, *least_loaded(prefill, decode))

    return decide


def admit_all_policy() -> Policy:
    def decide(request: AdmissionRequest, snapshot: ModelLoadSnapshot) -> Placement:
        prefill = [e for e in snapshot.engines if e.role == "prefill"]
        decode = [e for e in snapshot.engines if e.role == "decode"]
        return Placement(AdmissionDecision(True, "admission off"), *least_loaded(prefill, decode))

    return decide


def least_loaded(prefill: Sequence[EngineLoad], decode: Sequence[EngineLoad]) -> tuple[str, str]:
    p = min(prefill, key=lambda e: (e.queued_prefill_tokens, e.engine_id))
    d = min(decode, key=lambda e: (len(e.running) + e.admitted_ahead, e.engine_id))
    return p.engine_id, d.engine_id
