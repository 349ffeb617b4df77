"""The change stream's rates: an engine's recent rates from two readings of its counters (EngineRates), and
the fleet at a glance (PulseView) from the engines and the gateways. Pure functions over plain readings;
the stream's builder (watch_build.py) keeps the readings between builds.

Counters are cumulative, so a rate is the growth between two readings over the seconds between them:
- an engine's: tokens = prompt_tokens + generation_tokens; the prefix-cache hit rate = hits / queries; the
  mean TTFT = ttft_seconds_sum / ttft_seconds_count, the mean ITL likewise. A quantity whose counters went
  down between the readings (the engine restarted) is None for that window, as is a ratio whose
  denominator did not grow.
- the gateways': each gateway's `served` counters per class revision (gateways.served_by_gateway); its window
  is rollout.window's `counters_delta` per revision (a restarted gateway counts from zero, like Prometheus'
  increase()), summed over revisions. requests/s and rejections/s are the sums of the gateways' rates; TTFT
  p50/p90 and ITL p90 are quantiles (rollout.window.quantile, histogram_quantile's rule) of the gateways'
  histograms summed.
Two readings are compared only when at least MIN_WINDOW_S apart: over a shorter window of counters reported
every few seconds, the jitter of the reports is most of the figure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import reduce
from typing import Any, Generic, TypeVar

from fleetctl.controller.rollout.state import Histogram, ServedCounters
from fleetctl.controller.rollout.window import add_counters, add_histograms, counters_delta, quantile
from fleetctl.controller.watch_contract import EngineRates, PulseView
from fleetctl.flag_catalog import pins_of

MIN_WINDOW_S = 10.0
FAILED, READY, UP = "failed", "ready", "up"
T = TypeVar("T")
Ratio = tuple[float, float]  # (growth of the numerator, growth of the denominator)


@dataclass(frozen=True)
class Reading(Generic[T]):
    """A value of cumulative counters and when it was reported."""

    at: datetime
    value: T


def pick_window(readings: Sequence[Reading[T]], min_window_s: float = MIN_WINDOW_S) -> tuple[Reading[T], Reading[T]] | None:
    """The latest reading and the newest one at least `min_window_s` older (oldest first); None when no
    reading is that old yet."""
    if not readings:
        return None
    latest = readings[-1]
    for earlier in reversed(readings[:-1]):
        if (latest.at - earlier.at).total_seconds() >= min_window_s:
            return earlier, latest
    return None


# --- engines ---

@dataclass(frozen=True)
class EngineCounters:
    """The counters of an engine's reported metrics (engine.contract.EngineMetrics) that rates come from."""

    tokens: float = 0.0  # prompt + generation tokens
    prefix_hits: float = 0.0
    prefix_queries: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    itl_sum: float = 0.0
    itl_count: float = 0.0

    @classmethod
    def of(cls, metrics: Mapping[str, Any]) -> "EngineCounters":
        def figure(name: str) -> float:
            return float(metrics.get(name) or 0.0)

        return cls(tokens=figure("prompt_tokens") + figure("generation_tokens"),
                   prefix_hits=figure("prefix_cache_hits"), prefix_queries=figure("prefix_cache_queries"),
                   ttft_sum=figure("ttft_seconds_sum"), ttft_count=figure("ttft_seconds_count"),
                   itl_sum=figure("itl_seconds_sum"), itl_count=figure("itl_seconds_count"))


@dataclass(frozen=True)
class EngineWindow:
    """What one engine did between two readings; None: not known (a counter went down)."""

    seconds: float
    tokens: float | None
    prefix: Ratio | None  # (hits, queries)
    ttft: Ratio | None  # (seconds, requests)
    itl: Ratio | None  # (seconds, intervals)


def growth(before: float, after: float) -> float | None:
    """`after - before`; None when the counter went down (it was reset)."""
    return after - before if after >= before else None


def _ratio_growth(num: tuple[float, float], den: tuple[float, float]) -> Ratio | None:
    top, bottom = growth(*num), growth(*den)
    return None if top is None or bottom is None else (top, bottom)


def engine_window(earlier: Reading[EngineCounters], later: Reading[EngineCounters]) -> EngineWindow:
    a, b = earlier.value, later.value
    return EngineWindow(
        seconds=(later.at - earlier.at).total_seconds(),
        tokens=growth(a.tokens, b.tokens),
        prefix=_ratio_growth((a.prefix_hits, b.prefix_hits), (a.prefix_queries, b.prefix_queries)),
        ttft=_ratio_growth((a.ttft_sum, b.ttft_sum), (a.ttft_count, b.ttft_count)),
        itl=_ratio_growth((a.itl_sum, b.itl_sum), (a.itl_count, b.itl_count)),
    )


def ratio(value: Ratio | None, upper: float | None = None) -> float | None:
    """numerator / denominator; None when unknown or nothing was counted. `upper` caps the result."""
    if value is None or value[1] <= 0:
        return None
    result = value[0] / value[1]
    return _round(min(result, upper) if upper is not None else result)


def per_second(amount: float | None, seconds: float) -> float | None:
    return None if amount is None or seconds <= 0 else _round(amount / seconds)


def engine_rates(window: EngineWindow | None) -> EngineRates:
    """The engine's rates over `window`; all None without one (fewer than two readings far enough apart)."""
    if window is None:
        return EngineRates()
    return EngineRates(window_s=_round(window.seconds), tokens_s=per_second(window.tokens, window.seconds),
                       prefix_hit_rate=ratio(window.prefix, upper=1.0), ttft_s=ratio(window.ttft),
                       itl_s=ratio(window.itl))


# --- gateways ---

@dataclass(frozen=True)
class GatewayWindow:
    """What one gateway served between two of its reports, summed over class revisions."""

    seconds: float
    served: ServedCounters


def gateway_window(earlier: Reading[Mapping[str, ServedCounters]],
                   later: Reading[Mapping[str, ServedCounters]]) -> GatewayWindow:
    """Revisions only in `later` count from zero; those gone from it add nothing (rollout.window's rules)."""
    deltas = [counters_delta(earlier.value.get(ref), counters) for ref, counters in later.value.items()]
    return GatewayWindow((later.at - earlier.at).total_seconds(), reduce(add_counters, deltas, ServedCounters()))


# --- the pulse ---

def pulse(now: datetime, nodes: Sequence[Mapping[str, Any]], engines: Sequence[Mapping[str, Any]],
          engine_windows: Iterable[EngineWindow], gateways: Sequence[Mapping[str, Any]],
          gateway_windows: Iterable[GatewayWindow], flags: Mapping[str, Any]) -> PulseView:
    """The fleet at a glance. `engine_windows`: of the engines that run; `gateway_windows`: of the live
    gateways (a stale one's last window would stand for ever); `flags`: name -> value."""
    engine_windows, gateway_windows = list(engine_windows), list(gateway_windows)
    down = {n["name"] for n in nodes if n["state"] != UP}
    live_ages = [float(g["table_age_s"]) for g in gateways if not g["stale"]]
    seconds = [w.seconds for w in engine_windows] + [w.seconds for w in gateway_windows]
    return PulseView(
        at=now.isoformat(), window_s=_round(max(seconds)) if seconds else None,
        requests_s=_sum_of_rates((w.served.requests, w.seconds) for w in gateway_windows),
        rejections_s=_sum_of_rates((w.served.rejections, w.seconds) for w in gateway_windows),
        ttft_p50_s=_quantile([w.served.ttft for w in gateway_windows], 0.5),
        ttft_p90_s=_quantile([w.served.ttft for w in gateway_windows], 0.9),
        itl_p90_s=_quantile([w.served.itl for w in gateway_windows], 0.9),
        ttft_engines_s=ratio(_sum_ratios(w.ttft for w in engine_windows)),
        tokens_s=_sum_of_rates((w.tokens, w.seconds) for w in engine_windows if w.tokens is not None),
        prefix_hit_rate=ratio(_sum_ratios(w.prefix for w in engine_windows), upper=1.0),
        routing_table_age_s=max(live_ages) if live_ages else None,
        nodes=len(nodes), nodes_up=sum(n["state"] == UP for n in nodes),
        engines=len(engines), engines_ready=sum(e["state"] == READY for e in engines),
        engines_unhealthy=sum(e["state"] == FAILED or e["node"] in down for e in engines),
        drifted=sum(bool(e.get("drift")) for e in engines),
        frozen=flags.get("freeze") is True,
        pins=pins_of(flags),
        flags=dict(flags),
    )


def _sum_of_rates(amounts: Iterable[tuple[float, float]]) -> float | None:
    rates = [amount / seconds for amount, seconds in amounts if seconds > 0]
    return _round(sum(rates)) if rates else None


def _sum_ratios(ratios: Iterable[Ratio | None]) -> Ratio | None:
    known = [r for r in ratios if r is not None]
    return (sum(r[0] for r in known), sum(r[1] for r in known)) if known else None


def _quantile(histograms: Sequence[Histogram], q: float) -> float | None:
    if not histograms:
        return None
    value = quantile(reduce(add_histograms, histograms, Histogram()), q)
    return None if value is None else _round(value)


def _round(value: float) -> float:
    """Four decimals: finer than any figure is shown, coarse enough not to make a change of float noise."""
    return round(value, 4)
