"""Canary probe traffic: requests marked with `x-fleet-probe` (engine.contract.faults.PROBE_HEADER).

A probe is routed, admitted and served exactly like any other request, but it is not user traffic: it is
left out of the user-facing request and latency metrics (fleet_gateway_requests_total,
fleet_gateway_request_seconds, fleet_gateway_ttft_seconds, fleet_gateway_added_latency_seconds) and out of the per-class-revision counters
rollouts gate on (served.ServedRecorder). It is counted instead, per kind, in
fleet_gateway_probe_requests_total{model,class_ref,kind} and fleet_gateway_probe_tokens_total{...,type}.

Kinds: `pinned` (golden prompts pinned to one class revision), `production` (golden prompts through the
normal routing path) and `filler` (the load a pinned probe brings the engine's running batch to size with).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.contract.faults import PROBE_HEADER
from fleetctl.gateway.errors import BadRequest
from fleetctl.gateway.metrics import GatewayMetrics

PROBE_KINDS = ("pinned", "production", "filler")
NO_CLASS = "-"  # the class_ref label of a probe refused before a class was chosen


def probe_kind(headers: Mapping[str, str]) -> str | None:
    """The probe kind a request is marked with (None: user traffic); BadRequest naming the header otherwise."""
    value = headers.get(PROBE_HEADER)
    if value is None:
        return None
    kind = value.strip().lower()
    if kind not in PROBE_KINDS:
        raise BadRequest(f"{PROBE_HEADER} must be one of {', '.join(PROBE_KINDS)}, got {value!r}", param=PROBE_HEADER)
    return kind


@dataclass
class ProbeTokens:
    """Token counts of one probe: from the engine's usage where it sent one, else what the gateway saw."""

    prompt: int = 0
    completion: int = 0

    def from_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self.prompt = int(usage.get("prompt_tokens") or self.prompt)
            self.completion = int(usage.get("completion_tokens") or self.completion)


def record_probe(metrics: GatewayMetrics, model: str, class_ref: str | None, kind: str, tokens: ProbeTokens) -> None:
    labels = (model, class_ref or NO_CLASS, kind)
    metrics.probe_requests.labels(*labels).inc()
    metrics.probe_tokens.labels(*labels, "prompt").inc(tokens.prompt)
    metrics.probe_tokens.labels(*labels, "completion").inc(tokens.completion)
