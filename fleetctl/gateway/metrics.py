"""The gateway's own Prometheus metrics (GET /metrics), in one registry per gateway process.

Latency histograms use vLLM's bucket families (engine.metric_names) so gateway and engine panels line up.
Label values are bounded: models and engines come from the routing table, reasons from fixed vocabularies,
API keys appear by name only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine import metric_names as m

ADDED_LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]
KV_BYTES_BUCKETS = [2.0**k for k in range(10, 36, 2)]  # 1 KiB .. 16 GiB
TRANSFER_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("fleet_gateway_requests", "Client requests answered, by model and HTTP status.",
                                ["model", "code"], registry=r)
        self.request_seconds = Histogram("fleet_gateway_request_seconds", "Client request duration, arrival to last byte.",
                                         ["model"], buckets=m.REQUEST_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("fleet_gateway_ttft_seconds", "Time to first token as the client sees it.",
                              ["model"], buckets=m.TTFT_BUCKETS, registry=r)
        self.added_latency = Histogram(
            "fleet_gateway_added_latency_seconds",
            "Time the gateway adds before forwarding: parse, tokenise, hash, score, admit.",
            ["model"], buckets=ADDED_LATENCY_BUCKETS, registry=r)
        self.routed = Counter("fleet_gateway_routed", "Requests sent to an engine, by why it was chosen "
                              "(prefix, load, session, hot_spot, retry).", ["engine", "reason"], registry=r)
        self.prefix_warms = Counter("fleet_gateway_prefix_warms", "Popular prefixes prefilled ahead on an idle engine "
                                    "(--warm-prefix-requests), by engine and outcome (ok, failed, yielded: cancelled "
                                    "for a request sent to that engine).",
                                    ["engine", "outcome"], registry=r)
        self.retries = Counter("fleet_gateway_retries", "Requests retried on another engine, by the failure before the "
                               "first token.", ["reason"], registry=r)
        self.stream_errors = Counter("fleet_gateway_stream_errors", "Streams ended with an error event after tokens "
                                     "were sent.", ["reason"], registry=r)
        self.admission = Counter("fleet_gateway_admission_decisions", "Admission decisions by model and result.",
                                 ["model", "decision"], registry=r)
        self.admission_rejections = Counter("fleet_gateway_admission_rejections", "Requests refused with 429 by "
                                            "admission control, by model and violated limit.", ["model", "reason"], registry=r)
        self.shed = Counter("fleet_gateway_shed", "Requests refused with 429 by the model's shed_fraction flag.",
                            ["model"], registry=r)
        self.rate_limited = Counter("fleet_gateway_rate_limited", "Requests refused by an API key's rate limit.",
                                    ["key"], registry=r)
        self.table_age = Gauge("fleet_gateway_table_age_seconds", "Age of the routing table in use (NaN before the first).",
                               registry=r)
        self.table_failures = Gauge("fleet_gateway_table_refresh_failures", "Routing-table refreshes failed in a row.",
                                    registry=r)
        self.table_generation = Gauge("fleet_gateway_table_generation", "Generation of the routing table in use.", registry=r)
        self.engine_healthy = Gauge("fleet_gateway_engine_healthy", "1 if the gateway routes to the engine.",
                                    ["engine"], registry=r)
        self.engine_inflight = Gauge("fleet_gateway_engine_inflight", "The gateway's requests in flight on the engine.",
                                     ["engine"], registry=r)
        self.prefix_index_blocks = Gauge("fleet_gateway_prefix_index_blocks", "Blocks the prefix index holds per engine.",
                                         ["engine"], registry=r)
        self.engine_hash_mismatch = Gauge(
            "fleet_gateway_engine_hash_mismatch", "1 if the engine's KV events hash prefixes with another seed than "
            "the gateway's (its blocks never match the index: no prefix routing to it).", ["engine"], registry=r)
        self._build_pd()
        self._build_per_class()
        self._build_probes()

    def _build_pd(self) -> None:
        r = self.registry
        self.pd_handoffs = Counter("fleet_gateway_pd_handoffs", "P/D handoffs by result (ok, prefill_failed, "
                                   "decode_failed).", ["model", "result"], registry=r)
        self.pd_fallbacks = Counter("fleet_gateway_pd_fallbacks", "Requests of a P/D model served whole, by reason.",
                                    ["model", "reason"], registry=r)
        self.pd_queue = Histogram("fleet_gateway_pd_queue_seconds", "P/D TTFT part: arrival to the prefill request sent "
                                  "(gateway work and prefill retries).", ["model"], buckets=m.TTFT_BUCKETS, registry=r)
        self.pd_prefill = Histogram("fleet_gateway_pd_prefill_seconds", "P/D TTFT part: prefill request sent to its "
                                    "answer (engine queue + prefill).", ["model"], buckets=m.TTFT_BUCKETS, registry=r)
        self.pd_decode_first_byte = Histogram(
            "fleet_gateway_pd_decode_first_byte_seconds",
            "P/D TTFT part: decode request sent to its first token (K/V not yet pushed + first decode step).",
            ["model"], buckets=m.TTFT_BUCKETS, registry=r)
        self.pd_transfer = Histogram(
            "fleet_gateway_pd_transfer_seconds",
            "P/D K/V transfer wait on the decode engine, as the engine reports it (mean per handoff over a scrape).",
            ["engine"], buckets=TRANSFER_BUCKETS, registry=r)
        self.pd_kv_bytes = Histogram("fleet_gateway_pd_kv_bytes", "K/V bytes per P/D handoff (prefill's block count "
                                     "x bytes per block, where the engine tells its block size in bytes).",
                                     ["model"], buckets=KV_BYTES_BUCKETS, registry=r)
        self.pd_transferred_bytes = Counter("fleet_gateway_pd_transferred_bytes", "K/V bytes decode engines report "
                                            "having received.", ["engine"], registry=r)

    def _build_per_class(self) -> None:
        """Per class revision (served.ServedRecorder updates these with its counters)."""
        r, labels = self.registry, ["model", "class_ref"]
        self.class_requests = Counter("fleet_gateway_class_requests", "Client requests answered, by the class "
                                      "revision chosen for them and HTTP status.", [*labels, "code"], registry=r)
        self.class_errors = Counter("fleet_gateway_class_errors", "Requests of a class revision answered with a 5xx, "
                                    "or whose stream failed or was cut.", labels, registry=r)
        self.class_rejections = Counter("fleet_gateway_class_rejections", "Requests of a class revision refused "
                                        "with 429 (admission control, or the engine's own).", labels, registry=r)
        self.class_ttft = Histogram("fleet_gateway_class_ttft_seconds", "Time to first token of streams, by class "
                                    "revision.", labels, buckets=m.TTFT_BUCKETS, registry=r)
        self.class_itl = Histogram("fleet_gateway_class_itl_seconds", "Mean inter-token latency of each stream, by "
                                   "class revision.", labels, buckets=m.ITL_BUCKETS, registry=r)

    def _build_probes(self) -> None:
        """Canary probes (probe_traffic.py): counted here instead of in the request and latency metrics."""
        r, labels = self.registry, ["model", "class_ref", "kind"]
        self.probe_requests = Counter("fleet_gateway_probe_requests", "Canary probe requests answered (left out of "
                                      "the request, latency and per-class metrics), by kind.", labels, registry=r)
        self.probe_tokens = Counter("fleet_gateway_probe_tokens", "Tokens of canary probe requests, by kind and type "
                                    "(prompt, completion).", [*labels, "type"], registry=r)

    def watch_table(self, age: Callable[[], float | None], failures: Callable[[], int], generation: Callable[[], int | None]) -> None:
        self.table_age.set_function(lambda: _nan_if_none(age()))
        self.table_failures.set_function(lambda: float(failures()))
        self.table_generation.set_function(lambda: _nan_if_none(generation()))

    def forget_engine(self, engine: str) -> None:
        """Drop an engine's gauges once it left the routing table."""
        for gauge in (self.engine_healthy, self.engine_inflight, self.prefix_index_blocks, self.engine_hash_mismatch):
            with contextlib.suppress(KeyError):
                gauge.remove(engine)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _nan_if_none(value: float | int | None) -> float:
    return float("nan") if value is None else float(value)
