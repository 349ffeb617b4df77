"""The gateway's live view of one engine: health (active probes and passive failures), its last metrics
sample, the rates derived from its scrapes, and the gateway's own requests in flight on it.

Scrapes come every ~second; the gateway's own counts change the instant a request is sent or finishes, so
the load the router sees is the gateway's own requests now plus the others' the last sample showed:

    others   = sample.running + sample.waiting - own requests the scrape may have counted
    running  = own requests decoding now + the others' running (at most sample.running - own decoding)
    waiting  = own requests not yet at their first token now + the rest of the others

"Own requests the scrape may have counted" are those in flight at any moment between sending the scrape and
reading its answer (`begin_scrape` opens that window): one that finished while the answer was on its way, or
that the engine already ran while the gateway still waited for its first token, is the gateway's, not a
phantom other request holding a decode slot until the next scrape.

`take_sample` returns the rates derived since the previous sample; the service pools them per class.

Health: an engine is routable while it is `healthy`. A failed probe (GET /health not 200, or /metrics
unreachable) or a passive failure (refused connection, timeout, 503 on a request) marks it down at once,
without waiting for the controller; 5xx answers mark it down after `errors_to_down` in a row. The next
successful probe brings it back.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fleetctl.gateway.engine_metrics import EngineSample, SampleRates, derive_rates

ERRORS_TO_DOWN = 3
_ticket_ids = itertools.count()


@dataclass
class InFlight:
    """One request the gateway has sent to this engine and not yet seen finish.

    `cached_tokens` is how much of the prompt the router expected the engine to find in its prefix cache
    when it chose it: only the rest is prefill work queued on the engine. Counting the whole prompt made an
    engine that holds a shared prefix look busy by exactly the work its cache saves, so the next request
    sharing it went to an idle engine and recomputed it (benchmarks/routing.py --explain showed it).
    `block_hashes` (the prompt's full blocks) let later requests see this prefix on the engine before its
    KV events arrive: the engine will hold those blocks by the time it reaches them."""

    prompt_tokens: int
    max_tokens: int
    role: str = "mixed"  # the engine's part in it: mixed, prefill or decode
    cached_tokens: int = 0
    block_hashes: tuple[int, ...] = ()
    generated: int = 0
    first_token_at: float | None = None
    id: int = field(default_factory=lambda: next(_ticket_ids))

    @property
    def prefilling(self) -> bool:
        return self.first_token_at is None

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens the engine still has to compute for this request."""
        return max(0, self.prompt_tokens - self.cached_tokens)


@dataclass
class EngineLive:
    name: str
    url: str
    clock: Callable[[], float] = time.monotonic
    healthy: bool = True  # optimistic until the first probe: the table says it is ready
    down_reason: str | None = None
    consecutive_errors: int = 0
    sample: EngineSample | None = None
    sampled_at: float | None = None
    last_rates: SampleRates | None = None
    inflight: dict[int, InFlight] = field(default_factory=dict)
    others_waiting: int = 0  # requests on the engine at the last sample that are not the gateway's own
    others_running: int = 0
    _scrape_window: dict[int, InFlight] | None = None  # own requests in flight since the scrape was sent

    # --- health ---

    def probe_ok(self) -> None:
        self.healthy, self.down_reason, self.consecutive_errors = True, None, 0

    def mark_down(self, reason: str) -> None:
        self.healthy, self.down_reason = False, reason

    def record_failure(self, reason: str, hard: bool) -> None:
        """A request failed on this engine. `hard` (refused, timed out, 503): down now; else after a few."""
        self.consecutive_errors += 1
        if hard or self.consecutive_errors >= ERRORS_TO_DOWN:
            self.mark_down(reason)

    def record_success(self) -> None:
        self.consecutive_errors = 0

    # --- metrics ---

    def begin_scrape(self) -> None:
        """A scrape is on its way: every own request in flight from now until its answer may be in it."""
        self._scrape_window = dict(self.inflight)

    def scrape_failed(self) -> None:
        self._scrape_window = None

    def take_sample(self, sample: EngineSample) -> SampleRates | None:
        rates = derive_rates(self.sample, sample) if self.sample is not None else None
        self.sample, self.sampled_at, self.last_rates = sample, self.clock(), rates
        window = self._scrape_window if self._scrape_window is not None else dict(self.inflight)
        self._scrape_window = None
        # a request finished since, or decoding now, was past its prefill when the engine answered
        own_decoding = sum(1 for id_, t in window.items() if id_ not in self.inflight or not t.prefilling)
        others = max(0, sample.num_running + sample.num_waiting - len(window))
        self.others_running = min(others, max(0, sample.num_running - own_decoding))
        self.others_waiting = others - self.others_running
        return rates

    # --- the gateway's own requests ---

    def start(self, ticket: InFlight) -> InFlight:
        self.inflight[ticket.id] = ticket
        if self._scrape_window is not None:
            self._scrape_window[ticket.id] = ticket
        return ticket

    def finish(self, ticket: InFlight) -> None:
        self.inflight.pop(ticket.id, None)

    @property
    def own_prefilling(self) -> int:
        return sum(1 for t in self.inflight.values() if t.prefilling)

    @property
    def own_decoding(self) -> int:
        return sum(1 for t in self.inflight.values() if not t.prefilling)

    @property
    def own_queued_prefill_tokens(self) -> int:
        return sum(t.prefill_tokens for t in self.inflight.values() if t.prefilling)

    def inflight_prefix(self, block_hashes: Sequence[int]) -> int:
        """Leading blocks of `block_hashes` shared with a prompt the gateway has in flight here (the engine
        holds them, or will before it reaches a request queued behind; prefill engines and mixed ones only:
        a decode engine's blocks arrive from elsewhere)."""
        best = 0
        for ticket in self.inflight.values():
            if ticket.role != "decode" and ticket.block_hashes:
                best = max(best, leading_match(ticket.block_hashes, block_hashes))
        return best

    # --- load as the router sees it ---

    @property
    def num_waiting(self) -> int:
        return self.own_prefilling + self.others_waiting

    @property
    def num_running(self) -> int:
        return self.own_decoding + self.others_running

    @property
    def kv_cache_usage(self) -> float:
        return self.sample.kv_cache_usage if self.sample else 0.0


def leading_match(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
