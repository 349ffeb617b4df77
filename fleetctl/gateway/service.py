"""The gateway's state and the routing decision for one request: it gathers snapshots, the pure functions
decide (class_choice, scorer, admission via router.plan_route), and `prepare` returns the plan.

What it keeps current, each on its own task:
- the routing table (routing_table.RoutingTableCache over the controller, or static_table's discovery);
  on a new table: the engines' live views, the probes, the KV event subscriptions, the tokenizers;
- the engines' health and load (probes.EngineProber), the prefix index (kv_subscriber.KVSubscriberPool),
  recent shares and sessions (traffic);
- with a controller: a report, once per refresh interval, of the generation in use (table_reporter).
Nothing on the request path waits for the controller: a request routes on the table in hand, however old.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from engine.contract.faults import PIN_ENGINE_HEADER
from fleetctl.client import AsyncControllerClient
from fleetctl.errors import FleetError
from fleetctl.flag_catalog import value_of
from fleetctl.gateway.admission import ModelSLO
from fleetctl.gateway.class_choice import choose_class, fits, fleet_pin
from fleetctl.gateway.cross_node import (CrossNodeFetch, LocalCosts, PeerFetchPolicy, PeerOffer, link_estimate,
                                         plan_cross_node_fetch)
from fleetctl.gateway.direct import direct_flags
from fleetctl.gateway.engine_metrics import SampleRates, ewma
from fleetctl.gateway.engine_state import EngineLive
from fleetctl.gateway.errors import BadRequest, InvalidRoute, ModelNotFound, NoRoute
from fleetctl.gateway.hash_check import HashChecks
from fleetctl.gateway.kv_subscriber import KVSubscriberPool
from fleetctl.gateway.metrics import GatewayMetrics
from fleetctl.gateway.prefix_index import PrefixHit, PrefixIndex
from fleetctl.gateway.prefix_popularity import PrefixPopularity
from fleetctl.gateway.prefix_warming import WarmPlan, WarmPolicy, counts_popularity, plan_warm
from fleetctl.gateway.requests import ClientRequest, prompt_token_ids, resolve_model
from fleetctl.gateway.probes import EngineProber
from fleetctl.gateway.router import PD, Candidate, RoutePlan, choose_mode, pd_disabled_by_flag, plan_route, scorer_policy
from fleetctl.gateway.routing_table import EngineRoute, RoutingSource, RoutingTable, RoutingTableCache, kv_events_endpoints
from fleetctl.gateway.scorer import RouteRequest, ScorerPolicy, throughput_of
from fleetctl.gateway.served import ServedRecorder
from fleetctl.gateway.settings import GatewaySettings
from fleetctl.gateway.snapshot import Estimates, engine_load, engine_view
from fleetctl.gateway.table_reporter import report_applied
from fleetctl.gateway.tokenization import Tokenizers, prompt_block_hashes
from fleetctl.gateway.traffic import SessionMap, ShareTracker
from fleetctl.gateway.warmer import PrefixWarmer
from fleetctl.httpwire import EngineClient
from fleetctl.replica_class import ReplicaClassSpec

log = logging.getLogger(__name__)


@dataclass
class ClassRates:
    """A class's prefill throughput and decode step time, pooled over its engines' scrapes (EWMA)."""

    prefill_tokens_per_s: float | None = None
    decode_step_s: float | None = None

    def add(self, rates: SampleRates) -> None:
        self.prefill_tokens_per_s = ewma(self.prefill_tokens_per_s, rates.prefill_tokens_per_s)
        self.decode_step_s = ewma(self.decode_step_s, rates.decode_step_s)


@dataclass(frozen=True)
class Prepared:
    """A request, tokenised and routed (not yet sent)."""

    model: str
    class_ref: str
    spec: ReplicaClassSpec
    prompt_ids: list[int]
    block_hashes: list[int]
    max_tokens: int  # requested, or what the context window leaves
    plan: RoutePlan
    candidates: dict[str, Candidate]
    routes: dict[str, EngineRoute]
    flags: dict
    peer_fetch: CrossNodeFetch | None = None  # the first-ranked engine's cross-node fetch, fetched or not
    warm: WarmPlan | None = None  # an idle engine to prefill this request's popular prefix on (prefix_warming.py)


class GatewayService:
    def __init__(self, settings: GatewaySettings, source: RoutingSource, client: httpx.AsyncClient,
                 metrics: GatewayMetrics, tokenizers: Tokenizers | None = None,
                 rng: Callable[[], float] = random.random, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.source = source
        self.client = client  # the controller, static discovery, tokenizer downloads
        self.engine_client = EngineClient()  # the request path and the probes (fleetctl/httpwire.py says why not httpx)
        self.metrics = metrics
        self.served = ServedRecorder(metrics)  # per-revision counters, reported to the controller
        self.rng = rng
        self.clock = clock
        self.direct = direct_flags(settings)  # None: direct mode off (no state directory)
        self.cache = RoutingTableCache(source, refresh_interval_s=settings.table_refresh_s, on_update=self._on_table,
                                       overlay=self.direct.overlay if self.direct is not None else None)
        self.engines: dict[str, EngineLive] = {}
        self.index = PrefixIndex()
        self.hash_checks = HashChecks(self.settings.hash_seed)
        self.kv_pool = KVSubscriberPool(self.index, hash_checks=self.hash_checks)
        self.prober = EngineProber(self.engine_client, settings.probe_interval_s, settings.probe_timeout_s,
                                   self.engine_headers(), on_rates=self._on_rates)
        self.tokenizers = tokenizers or Tokenizers(client)
        self.shares = ShareTracker(settings.share_half_life_requests_per_engine)
        self.sessions = SessionMap(settings.max_sessions)
        self.policy = scorer_policy_of(settings)
        self.popularity = PrefixPopularity()
        self.warm_policy = WarmPolicy(settings.warm_prefix_requests, settings.warm_min_blocks)
        self.warmer = PrefixWarmer(self.engine_client, self.engine_headers, metrics, settings.connect_timeout_s,
                                   settings.request_timeout_s)
        self.peer_policy = PeerFetchPolicy()
        self.mean_prompt_tokens: float | None = None
        self.class_rates: dict[str, ClassRates] = {}  # class_ref -> pooled rate estimates of its engines
        self._engine_class: dict[str, str] = {}
        self._tasks: list[asyncio.Task] = []
        metrics.watch_table(self.cache.age_s, lambda: self.cache.failures,
                            lambda: self.cache.table.generation if self.cache.table else None)

    # --- lifecycle ---

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self.cache.run(), name="routing-table"))
        if isinstance(self.source, AsyncControllerClient):
            self._tasks.append(asyncio.create_task(self._report_applied(), name="routing-report"))

    async def _report_applied(self) -> None:
        """Tell the controller, once per refresh interval, which generation this gateway routes on
        (`fleetctl traffic set` waits for it) and what it served per class revision (rollout analysis reads
        it, so the controller's counters are at most one interval old). Skipped while the controller is
        unreachable."""
        while True:
            await asyncio.sleep(self.settings.table_refresh_s)
            table = self.cache.table
            if table is not None and self.cache.failures == 0:
                reported = await report_applied(self.source, self.settings.name, self.settings.url, table.generation,  # type: ignore[arg-type]
                                                self.cache.age_s() or 0.0, refresh_interval_s=self.settings.table_refresh_s,
                                                served=self.served.snapshot(),
                                                hash_mismatch=self.hash_checks.mismatched())
                if reported and self.direct is not None:
                    await self.sync_direct()

    async def sync_direct(self) -> None:
        """Upload the direct-action journal and drop the local overrides the operator resolved."""
        upload = self.direct.upload(self.settings.name) if self.direct is not None else None
        if upload is None:
            return
        try:
            raw = await self.source.upload_direct_actions(upload.model_dump(mode="json"))  # type: ignore[attr-defined]
        except FleetError as exc:
            log.warning("could not upload %d direct action(s): %s", len(upload.actions), exc)
            return
        if self.direct.apply_reply(raw):  # type: ignore[union-attr]  (the client parsed it: DirectUploadReply)
            self.cache.reapply()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.warmer.close()
        await self.prober.close()
        await self.kv_pool.close()
        await self.tokenizers.close()
        await self.engine_client.aclose()

    def engine_headers(self) -> dict[str, str]:
        key = self.settings.engine_api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _on_table(self, table: RoutingTable) -> None:
        log.info("routing table generation %d: %d model(s), %d engine(s)", table.generation, len(table.models), len(table.engines))
        self._sync_engines(table)
        self.served.keep_only(ref for model in table.models.values() for ref in model.classes)
        self.prober.sync(self.engines)
        await self.kv_pool.sync(kv_events_endpoints(table))
        for model in table.models.values():
            for spec in model.classes.values():
                self.tokenizers.preload(spec)

    def _sync_engines(self, table: RoutingTable) -> None:
        self._engine_class = {e.name: e.class_ref for e in table.engines}
        wanted = {e.name: e.url for e in table.engines if e.routable}
        for name in list(self.engines):
            if wanted.get(name) != self.engines[name].url:
                del self.engines[name]
                self.shares.forget(name)
                self.metrics.forget_engine(name)
        for name, url in wanted.items():
            if name not in self.engines and url is not None:
                self.engines[name] = EngineLive(name, url, clock=self.clock)
        self.shares.engines = len(self.engines)
        # prefix counts decay over as many requests as the traffic shares do
        self.popularity.half_life_requests = self.shares.half_life_requests

    def _on_rates(self, live: EngineLive, rates: SampleRates) -> None:
        class_ref = self._engine_class.get(live.name)
        if class_ref is not None:
            self.class_rates.setdefault(class_ref, ClassRates()).add(rates)
        if rates.kv_transfers:
            mean = rates.kv_transfer_seconds / rates.kv_transfers
            for _ in range(rates.kv_transfers):
                self.metrics.pd_transfer.labels(live.name).observe(mean)
            self.metrics.pd_transferred_bytes.labels(live.name).inc(rates.kv_transfer_bytes)

    def refresh_gauges(self) -> None:
        """Per-engine gauges, set just before an exposition."""
        for name, live in self.engines.items():
            self.metrics.engine_healthy.labels(name).set(1 if live.healthy else 0)
            self.metrics.engine_inflight.labels(name).set(len(live.inflight))
            self.metrics.prefix_index_blocks.labels(name).set(self.index.num_blocks(name))
            self.metrics.engine_hash_mismatch.labels(name).set(
                1 if self.hash_checks.status(name) == "hash_mismatch" else 0)

    # --- reads ---

    @property
    def table(self) -> RoutingTable | None:
        return self.cache.table

    def require_table(self) -> RoutingTable:
        if self.cache.table is None:
            raise NoRoute("the gateway has no routing table yet" + (f" ({self.cache.last_error})" if self.cache.last_error else ""))
        return self.cache.table

    def estimates(self, class_ref: str) -> Estimates:
        rates = self.class_rates.get(class_ref, ClassRates())
        return Estimates(
            prefill_tokens_per_s=rates.prefill_tokens_per_s or self.settings.default_prefill_tokens_per_s,
            decode_step_s=rates.decode_step_s or self.settings.default_decode_step_s,
            others_prompt_tokens=int(self.mean_prompt_tokens or 0),
        )

    def slo(self, flags: Mapping[str, Any] | None = None) -> ModelSLO | None:
        """The admission SLO; None (every request admitted) when admission is off in the settings or by the
        `admission_control` flag."""
        if not self.settings.admission or not value_of(flags or {}, "admission_control"):
            return None
        return ModelSLO(ttft_slo_s=self.settings.ttft_slo_s, max_decode_slots=self.settings.max_decode_slots)

    def shed(self, model: str) -> bool:
        """Whether to reject this request of `model` now: a draw under its `shed_fraction` flag."""
        table = self.cache.table
        fraction = float(value_of(table.flags, "shed_fraction", model)) if table is not None else 0.0
        return should_shed(fraction, self.rng())

    def model_label(self, request: ClientRequest) -> str:
        """The request's model for metric labels: a model of the table, else "unknown" (bounded labels)."""
        table = self.cache.table
        if table is None:
            return "unknown"
        try:
            model = resolve_model(request, table.models)
        except BadRequest:
            return "unknown"
        return model if model in table.models else "unknown"

    # --- the decision for one request ---

    async def prepare(self, request: ClientRequest, pin: str | None, session_id: str | None,
                      pin_engine: str | None = None) -> Prepared:
        """The route for one request. `pin_engine` (a canary probe's x-fleet-pin-engine) narrows the chosen
        class's engines to that one."""
        table = self.require_table()
        model = resolve_model(request, table.models)
        model_route = table.models.get(model)
        if model_route is None:
            raise ModelNotFound(f"The model `{model}` does not exist.", param="model")
        pinned = fleet_pin(table.flags, model, model_route.classes) if pin is None else None
        class_ref = pinned or choose_class(model_route.traffic, pin, self.rng())
        spec = model_route.classes.get(class_ref)
        if spec is None:
            raise NoRoute(f"class {class_ref} of model {model} has no spec in the routing table")
        routes = {e.name: e for e in table.engines_of(model) if e.class_ref == class_ref}
        if pin_engine is not None:
            routes = pinned_engine(routes, pin_engine, class_ref)
        else:  # a cordoned engine takes no new request; a probe that names it still reaches it
            routes = {name: route for name, route in routes.items() if not route.cordoned}
        prompt_ids = await self._tokenise(request, model, spec, routes)
        max_tokens = self._check_fits(request, prompt_ids, spec, class_ref)
        hashes = prompt_block_hashes(prompt_ids, self._block_size(routes, spec), self.settings.hash_seed)
        candidates = self._candidates(routes, spec, hashes, self.estimates(class_ref))
        mode = choose_mode(model_route.pd, pd_disabled_by_flag(table.flags, model), list(candidates.values()))
        route_request = RouteRequest(hashes, len(prompt_ids), session_id, prefix_requests=self._prefix_requests(hashes))
        plan = plan_route(route_request, max_tokens, class_ref, mode, list(candidates.values()),
                          scorer_policy(self.policy, table.flags), self.slo(table.flags),
                          self.sessions.as_mapping(session_id))
        peer_fetch = self._peer_fetch(plan, candidates, table.engines_of(model), hashes, spec)
        return Prepared(model, class_ref, spec, prompt_ids, hashes, max_tokens, plan, candidates, routes,
                        dict(table.flags), peer_fetch, self._warm_plan(route_request, plan, candidates))

    @property
    def _uses_popularity(self) -> bool:
        return counts_popularity(self.policy, self.warm_policy)

    def _prefix_requests(self, hashes: list[int]) -> tuple[float, ...]:
        """Recent requests that began with each prefix of this prompt; () when nothing uses them."""
        return self.popularity.counts(hashes) if self._uses_popularity else ()

    def _warm_plan(self, request: RouteRequest, plan: RoutePlan, candidates: dict[str, Candidate]) -> WarmPlan | None:
        if plan.mode == PD or not plan.candidates:
            return None
        return plan_warm(request, plan.candidates[0].engine_id, [c.view for c in candidates.values()],
                         self.warmer.warming, self.warm_policy, self.policy.engines_share_hardware)

    def admitted(self, prepared: Prepared) -> None:
        """A user's request was admitted: its prefixes count as traffic (prefix_popularity.py) and its planned
        warm, if any, goes out. Only here: an explained, shed, rejected or probe request, or a P/D fallback's
        second plan of the same request, is not traffic to count."""
        if self._uses_popularity:
            self.popularity.record(prepared.block_hashes)
        self.start_warm(prepared)

    def start_warm(self, prepared: Prepared) -> None:
        """Send the request's planned warm, if any, in the background."""
        plan = prepared.warm
        live = self.engines.get(plan.engine_id) if plan is not None else None
        route = prepared.routes.get(plan.engine_id) if plan is not None else None
        if plan is None or live is None or route is None:
            return
        block_size = prepared.candidates[plan.engine_id].view.block_size
        self.warmer.start(plan, route, live, prepared.prompt_ids, prepared.block_hashes, block_size)

    def _peer_fetch(self, plan: RoutePlan, candidates: dict[str, Candidate], engines: list[EngineRoute],
                    hashes: list[int], spec: ReplicaClassSpec) -> CrossNodeFetch | None:
        """Whether the first-ranked engine should fetch blocks from another node's tier (gateway/cross_node.py).
        Reference-engine classes with tiers only: vLLM's connectors have no peer fetch."""
        if not plan.candidates or not hashes or spec.backend != "reference" or not spec.kv_tiers:
            return None
        chosen = plan.candidates[0]
        view, live = candidates[chosen.engine_id].view, self.engines[chosen.engine_id]
        route = next((e for e in engines if e.name == chosen.engine_id), None)
        block_bytes = live.sample.kv_bytes_per_block if live.sample is not None else None
        if route is None or block_bytes is None:
            return None
        offers = []
        for peer in engines:
            peer_live = self.engines.get(peer.name)
            if (peer.class_ref == route.class_ref and peer.node != route.node and peer.routable and peer.url
                    and peer_live is not None and peer_live.healthy):
                offers.append(PeerOffer(peer.name, peer.node, peer.url, self.index.node_tier_run(hashes, peer.name)))
        if not offers:
            return None
        throughput = throughput_of(view, self.policy)
        local = LocalCosts(view.memory_blocks, view.cached_blocks - view.memory_blocks, chosen.fetch_s,
                           view.block_size / throughput, block_bytes)
        measured = live.sample.peer_links()
        links = {o.node: link_estimate(measured, o.node, self.peer_policy) for o in offers}
        return plan_cross_node_fetch(chosen.engine_id, local, offers, links)

    async def _tokenise(self, request: ClientRequest, model: str, spec: ReplicaClassSpec,
                        routes: dict[str, EngineRoute]) -> list[int]:
        def urls() -> list[str]:
            return [r.url for n, r in routes.items() if r.url and n in self.engines and self.engines[n].healthy]

        tokenizer = await self.tokenizers.get(model, spec, urls)
        prompt_ids = await prompt_token_ids(request, tokenizer)
        self.mean_prompt_tokens = ewma(self.mean_prompt_tokens, float(len(prompt_ids)), 0.1)
        return prompt_ids

    def _check_fits(self, request: ClientRequest, prompt_ids: list[int], spec: ReplicaClassSpec, class_ref: str) -> int:
        """The request's max_tokens (or what the window leaves); 400 naming the problem when it does not fit."""
        problem = fits(len(prompt_ids), request.max_tokens, spec)
        if problem is not None:
            param = "max_tokens" if request.max_tokens is not None and len(prompt_ids) < spec.max_model_len else request.prompt_param
            raise BadRequest(f"{problem} (class {class_ref})", param=param)
        return request.max_tokens if request.max_tokens is not None else spec.max_model_len - len(prompt_ids)

    def _block_size(self, routes: dict[str, EngineRoute], spec: ReplicaClassSpec) -> int:
        for name in routes:
            live = self.engines.get(name)
            if live is not None and live.sample is not None and live.sample.block_size:
                return live.sample.block_size
        return spec.block_size

    def _candidates(self, routes: dict[str, EngineRoute], spec: ReplicaClassSpec, hashes: list[int],
                    estimates: Estimates) -> dict[str, Candidate]:
        names = [n for n in routes if n in self.engines]
        hits = self.index.prefix_hits(hashes, names) if hashes else {}
        if hashes:  # prefixes routed here and still in flight count as held in memory before their KV events arrive
            for name in names:
                hits[name] = hits.get(name, PrefixHit()).with_memory(self.engines[name].inflight_prefix(hashes))
        shares = self.shares.shares(names)
        result = {}
        for name in names:
            route, live = routes[name], self.engines[name]
            view = engine_view(route, live, spec, hits.get(name, PrefixHit()), shares[name], estimates)
            result[name] = Candidate(view, engine_load(route, live, spec, estimates))
        return result

    def describe_unhealthy(self, prepared: Prepared) -> str:
        """Why each engine of the class is out of rotation (for a 503's message)."""
        parts = [f"{name}: {self.engines[name].down_reason or 'down'}" for name in prepared.routes
                 if name in self.engines and not self.engines[name].healthy]
        missing = [name for name in prepared.routes if name not in self.engines]
        parts += [f"{name}: not ready" for name in missing]
        return "; ".join(parts) or "the class has no engine"


# GatewaySettings fields that are ScorerPolicy fields of the same name and meaning
SCORER_SETTINGS = ("locality_weight", "hot_spot_factor", "hot_spot_damping", "engines_share_hardware",
                   "shared_prefix_requests", "running_cost_steps", "default_prefill_tokens_per_s",
                   "shared_hardware_own_load")


def scorer_policy_of(settings: GatewaySettings) -> ScorerPolicy:
    return ScorerPolicy(**{name: getattr(settings, name) for name in SCORER_SETTINGS})


def should_shed(fraction: float, draw: float) -> bool:
    """`draw` uniform in [0, 1): shed with probability `fraction` (0 never, 1 always)."""
    return draw < fraction


def pinned_engine(routes: dict[str, EngineRoute], engine: str, class_ref: str) -> dict[str, EngineRoute]:
    if engine not in routes:
        raise InvalidRoute(f"pinned engine {engine!r} does not serve class {class_ref}", param=PIN_ENGINE_HEADER)
    return {engine: routes[engine]}
