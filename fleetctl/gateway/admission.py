"""Admission control: admit a request only if the model can serve it within its SLO, judged on PREDICTED load.

Admission on observed load makes prefill and decode oscillate (Mooncake): a full decode pool rejects new
requests, the prefill queue empties, decodes finish, everything is admitted at once, and the decode pool
overflows again. So the predictor asks what the fleet will look like when this request gets there:

    at_decode     = (queued_prefill_tokens + num_prompt_tokens) / prefill_tokens_per_s      (prefill engine)
    ttft          = at_decode + decode_step_s on a separate decode engine: its first step makes the first
                    token (on a mixed engine the prefill's last step does, so nothing is added)
    decode_load   = #running decodes with remaining_tokens * decode_step_s > at_decode          (decode engine)
                    + admitted_ahead (requests already admitted that reach decode first) + 1 (this one)
    kv_free       = kv_headroom_tokens
                    + kv_tokens of decodes finished by at_decode
                    - tokens the still-running decodes add by then (at_decode / decode_step_s each, at most remaining)
                    - queued_prefill_tokens of the decode engine (its admitted prompts)

A candidate (prefill engine, decode engine) passes when ttft <= ttft_slo_s, decode_load <= its slots
(max_decode_slots, or the engine's max_num_seqs) and kv_free >= num_prompt_tokens. A mixed engine is its own
pair; with P/D every prefill engine pairs with every decode engine. Admit when any candidate passes (the one
with the lowest ttft is reported); otherwise reject with Retry-After = the smallest, over candidates, of the
time until each of its violations clears (queue drained below the SLO, enough decodes finished), rounded up
and clamped to [1, max_retry_after_s].

`admit_on_observed_load` is the baseline for the benchmark: reject when the current waiting or running
counts exceed thresholds. Both functions are pure: the live gateway and the simulator call the same code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

PREFILL_ROLES = ("prefill", "mixed")
DECODE_ROLES = ("decode", "mixed")


@dataclass(frozen=True)
class RunningDecode:
    remaining_tokens: int  # tokens still to generate (estimate: max_tokens - generated)
    kv_tokens: int = 0  # tokens it holds in KV now


@dataclass(frozen=True)
class EngineLoad:
    """One engine of the model at decision time."""

    engine_id: str
    role: str = "mixed"  # prefill | decode | mixed
    queued_prefill_tokens: int = 0  # prompt tokens admitted and not yet prefilled
    prefill_tokens_per_s: float = 2000.0
    admitted_ahead: int = 0  # requests admitted here that reach decode before a new one (waiting / in flight)
    running: tuple[RunningDecode, ...] = ()
    max_num_seqs: int = 64
    decode_step_s: float = 0.02  # seconds per decode step at the current batch
    kv_headroom_tokens: int = 0  # free KV now, in tokens


@dataclass(frozen=True)
class ModelLoadSnapshot:
    engines: Sequence[EngineLoad]


@dataclass(frozen=True)
class ModelSLO:
    ttft_slo_s: float
    max_decode_slots: int | None = None  # concurrent decodes per engine; None: the engine's max_num_seqs
    max_retry_after_s: int = 60


@dataclass(frozen=True)
class AdmissionRequest:
    num_prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class Prediction:
    """What one (prefill engine, decode engine) pair would give the request."""

    prefill_engine: str
    decode_engine: str
    ttft_s: float
    decode_load: int  # concurrent decodes on the decode engine when this request gets there, itself included
    decode_slots: int
    kv_free_tokens: int  # predicted free KV on the decode engine then
    violations: tuple[str, ...] = ()
    clears_in_s: float = 0.0  # time until every violation clears (inf: cannot tell)


@dataclass(frozen=True)
class AdmissionDecision:
    admit: bool
    reason: str
    retry_after_s: int | None = None  # set when rejected (HTTP 429 Retry-After)
    prediction: Prediction | None = None  # the chosen pair when admitted, the nearest to passing otherwise


@dataclass(frozen=True)
class ObservedLoadThresholds:
    """The baseline policy: reject when every engine looks busy right now."""

    max_waiting: int = 8  # requests waiting for prefill, per engine
    max_running_fraction: float = 1.0  # running decodes / max_num_seqs, per engine
    retry_after_s: int = 1


# --- the predictor ---


def admit_on_predicted_load(request: AdmissionRequest, snapshot: ModelLoadSnapshot, slo: ModelSLO) -> AdmissionDecision:
    predictions = [predict(request, p, d, slo) for p, d in candidate_pairs(snapshot.engines)]
    if not predictions:
        return AdmissionDecision(False, "no engine serves the model", retry_after_s=slo.max_retry_after_s)
    passing = [p for p in predictions if not p.violations]
    if passing:
        best = min(passing, key=lambda p: (p.ttft_s, p.decode_load))
        reason = f"predicted TTFT {best.ttft_s:.2f}s, decode {best.decode_load}/{best.decode_slots}"
        return AdmissionDecision(True, reason, prediction=best)
    nearest = min(predictions, key=lambda p: (p.clears_in_s, p.ttft_s))
    return AdmissionDecision(False, "; ".join(nearest.violations), retry_after(nearest.clears_in_s, slo), nearest)


def candidate_pairs(engines: Sequence[EngineLoad]) -> list[tuple[EngineLoad, EngineLoad]]:
    """(prefill, decode) pairs a request could take: a mixed engine alone, or any prefill with any decode."""
    pairs = [(e, e) for e in engines if e.role == "mixed"]
    prefill = [e for e in engines if e.role == "prefill"]
    decode = [e for e in engines if e.role == "decode"]
    return pairs + [(p, d) for p in prefill for d in decode]


def predict(request: AdmissionRequest, prefill: EngineLoad, decode: EngineLoad, slo: ModelSLO) -> Prediction:
    at_decode = prefill_done_in(request, prefill)
    ttft = at_decode + first_decode_step_s(prefill, decode)
    slots = slo.max_decode_slots or decode.max_num_seqs
    load = decode_load_at(decode, at_decode)
    kv_free = kv_free_at(decode, at_decode)
    violations: list[str] = []
    waits: list[float] = []
    if ttft > slo.ttft_slo_s:
        violations.append(f"predicted TTFT {ttft:.2f}s > SLO {slo.ttft_slo_s:.2f}s on {prefill.engine_id}")
        waits.append(ttft - slo.ttft_slo_s)  # the queue drains at the prefill rate: one second per second
    if load > slots:
        violations.append(f"decode slots {load}/{slots} on {decode.engine_id} at +{at_decode:.2f}s")
        waits.append(time_until_finished(decode, at_decode, load - slots))
    if kv_free < request.num_prompt_tokens:
        violations.append(
            f"KV {kv_free} tokens free < {request.num_prompt_tokens} needed on {decode.engine_id} at +{at_decode:.2f}s"
        )
        waits.append(time_until_kv_freed(decode, at_decode, request.num_prompt_tokens - kv_free))
    return Prediction(
        prefill_engine=prefill.engine_id,
        decode_engine=decode.engine_id,
        ttft_s=ttft,
        decode_load=load,
        decode_slots=slots,
        kv_free_tokens=kv_free,
        violations=tuple(violations),
        clears_in_s=max(waits, default=0.0),
    )


def prefill_done_in(request: AdmissionRequest, prefill: EngineLoad) -> float:
    """Seconds until the request's prefill is done: the queue ahead of it, then its own prompt."""
    if prefill.prefill_tokens_per_s <= 0:
        return math.inf  # no throughput estimate: never predict a pass
    return (prefill.queued_prefill_tokens + request.num_prompt_tokens) / prefill.prefill_tokens_per_s


def first_decode_step_s(prefill: EngineLoad, decode: EngineLoad) -> float:
    """After a P/D handoff the decode engine's next step makes the first token: at a full batch that step
    is a sizeable part of the SLO (0.8 s of 5 s in benchmarks/admission.py). A mixed engine's prefill makes
    it itself."""
    return 0.0 if prefill.engine_id == decode.engine_id else decode.decode_step_s


def finish_time(decode: EngineLoad, running: RunningDecode) -> float:
    return running.remaining_tokens * decode.decode_step_s


def decode_load_at(decode: EngineLoad, t: float) -> int:
    still_running = sum(1 for r in decode.running if finish_time(decode, r) > t)
    return still_running + decode.admitted_ahead + 1


def steps_by(decode: EngineLoad, t: float) -> int:
    """Decode steps the engine completes in `t` seconds (capped: an infinite t would overflow int)."""
    if decode.decode_step_s <= 0 or math.isinf(t):
        return 1 << 62
    return int(t / decode.decode_step_s)


def kv_free_at(decode: EngineLoad, t: float) -> int:
    steps = steps_by(decode, t)
    freed = sum(r.kv_tokens for r in decode.running if finish_time(decode, r) <= t)
    grown = sum(min(steps, r.remaining_tokens) for r in decode.running if finish_time(decode, r) > t)
    return decode.kv_headroom_tokens + freed - grown - decode.queued_prefill_tokens


def time_until_finished(decode: EngineLoad, t: float, count: int) -> float:
    """Seconds after `t` until `count` more of the decodes running at `t` finish (inf if fewer run)."""
    later = sorted(finish_time(decode, r) for r in decode.running if finish_time(decode, r) > t)
    return later[count - 1] - t if count <= len(later) else math.inf


def time_until_kv_freed(decode: EngineLoad, t: float, tokens: int) -> float:
    """Seconds after `t` until decodes finishing after `t` free `tokens` of KV (inf if they never do)."""
    steps = steps_by(decode, t)
    freed = 0
    for r in sorted((r for r in decode.running if finish_time(decode, r) > t), key=lambda r: finish_time(decode, r)):
        freed += r.kv_tokens + min(steps, r.remaining_tokens)  # what it holds at t, returned when it ends
        if freed >= tokens:
            return finish_time(decode, r) - t
    return math.inf


def retry_after(seconds: float, slo: ModelSLO) -> int:
    if math.isinf(seconds):
        return slo.max_retry_after_s
    return max(1, min(slo.max_retry_after_s, math.ceil(seconds)))


# --- the baseline: observed load ---


def admit_on_observed_load(snapshot: ModelLoadSnapshot, thresholds: ObservedLoadThresholds) -> AdmissionDecision:
    """Admit when some (prefill, decode) pair looks free NOW; the policy that oscillates."""
    for prefill, decode in candidate_pairs(snapshot.engines):
        waiting_ok = prefill.admitted_ahead < thresholds.max_waiting
        running_ok = len(decode.running) < thresholds.max_running_fraction * decode.max_num_seqs
        if waiting_ok and running_ok:
            reason = f"{prefill.admitted_ahead} waiting on {prefill.engine_id}, {len(decode.running)} running on {decode.engine_id}"
            return AdmissionDecision(True, reason)
    return AdmissionDecision(False, "every engine is above its waiting or running threshold", thresholds.retry_after_s)
