"""What a simulation run gives back: how each request ended, the fleet's queues over time, preemptions.

Plain frozen data, so two runs compare with `==` and a test, the benchmark or the P:D planner can read the
same object. Invariant (conservation): every request of the workload has exactly one `RequestResult`, in
workload order, and its `outcome` is one of `Outcome`; a rejected or failed request carries a non-empty
`reason` (the admission decision's reason when rejected, what went wrong when failed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from fleetctl.sim.requests import RequestSpec


class Outcome(str, Enum):
    COMPLETED = "completed"  # admitted and generated all its output tokens
    REJECTED = "rejected"  # admission said no (HTTP 429 in the live gateway)
    FAILED = "failed"  # admitted, but an engine refused it or it had not finished at the horizon


@dataclass(frozen=True)
class RequestResult:
    """How one request ended. Times are simulated seconds from the start of the run."""

    request_id: int
    arrival_s: float
    outcome: Outcome
    reason: str  # admission's reason (completed, rejected) or the failure's (failed)
    retry_after_s: int | None = None  # rejected: the admission decision's Retry-After
    prefill_engine: str | None = None  # admitted: where it was sent
    decode_engine: str | None = None
    first_token_s: float | None = None  # the end of its first decode step
    finished_s: float | None = None  # completed: the end of its last decode step
    preemptions: int = 0  # times its KV was dropped to make room (recomputed later)

    @property
    def admitted(self) -> bool:
        return self.outcome is not Outcome.REJECTED

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s


@dataclass(frozen=True)
class QueueSample:
    """Fleet-wide queue lengths at one sampling instant."""

    t_s: float
    prefill_queue: int  # requests waiting for prefill or in prefill
    decode_queue: int  # prefilled (or preempted) requests waiting for a decode slot and KV
    decode_running: int  # sequences in decode batches


@dataclass(frozen=True)
class SimResult:
    requests: tuple[RequestResult, ...]  # one per workload request, in workload order
    samples: tuple[QueueSample, ...]  # every `sample_every_s` from 0 to the run's duration
    preemptions: int  # over all decode engines

    def with_outcome(self, outcome: Outcome) -> list[RequestResult]:
        return [r for r in self.requests if r.outcome is outcome]

    def counts(self) -> dict[Outcome, int]:
        return {outcome: len(self.with_outcome(outcome)) for outcome in Outcome}

    def admitted_per_second(self) -> dict[int, int]:
        """Admissions by whole second of arrival (admission happens at arrival)."""
        per_s: dict[int, int] = {}
        for r in self.requests:
            if r.admitted:
                per_s[int(r.arrival_s)] = per_s.get(int(r.arrival_s), 0) + 1
        return per_s


def goodput(result: SimResult, workload: Sequence[RequestSpec], ttft_slo_s: float, itl_slo_s: float) -> float:
    """The fraction of the workload's requests completed within both SLOs: TTFT, and the mean ITL over the
    request ((finished - first token) / (output tokens - 1))."""
    good = 0
    for spec, r in zip(workload, result.requests):  # one result per request, in workload order
        if r.finished_s is None or r.first_token_s is None:
            continue
        itl = (r.finished_s - r.first_token_s) / max(1, spec.output_tokens - 1)
        good += r.first_token_s - r.arrival_s <= ttft_slo_s and itl <= itl_slo_s
    return good / len(workload) if workload else 0.0
