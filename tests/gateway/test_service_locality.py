"""The gateway's candidates for a request: what the prefix index says each engine holds, plus the prompts the
gateway has routed there and not yet seen finish (their KV events come only after the engine computes them),
and queued prefill work that counts only what each in-flight request's cache hit leaves to compute."""

from __future__ import annotations

import httpx
import pytest

from engine.kv_events import BlockStored, EventBatch
from fleetctl.gateway.dispatch import Dispatcher
from fleetctl.gateway.metrics import GatewayMetrics
from fleetctl.gateway.routing_table import parse_routing_table
from fleetctl.gateway.scorer import RouteRequest, RoutingSnapshot, ScorerPolicy, rank_engines
from fleetctl.gateway.service import GatewayService, Prepared
from fleetctl.gateway.settings import GatewaySettings
from fleetctl.gateway.snapshot import Estimates
from fleetctl.gateway.static_table import Discovered, build_table, parse_static_engine, spec_from_card

PROMPT_HASHES = [11, 12, 13, 14]  # four full 16-token blocks
PROMPT_TOKENS = 70


@pytest.fixture
async def service():
    spec = spec_from_card({"id": "tiny", "root": "tiny", "max_model_len": 2048}, 16)
    body = build_table([Discovered(parse_static_engine(f"http://127.0.0.1:{port}"), "tiny", spec) for port in (1, 2)], {})
    table = parse_routing_table(body)
    async with httpx.AsyncClient() as client:
        gateway = GatewayService(GatewaySettings(static_engines=("http://127.0.0.1:1",)), None, client,  # type: ignore[arg-type]
                                 GatewayMetrics())
        gateway._sync_engines(table)
        routes = {e.name: e for e in table.engines_of("tiny")}
        yield gateway, routes, table.models["tiny"].classes[next(iter(table.models["tiny"].classes))]


def candidates(gateway: GatewayService, routes, spec, hashes=PROMPT_HASHES):
    return gateway._candidates(routes, spec, list(hashes), Estimates(prefill_tokens_per_s=1000.0))


def prepared_for(gateway: GatewayService, routes, spec) -> Prepared:
    found = candidates(gateway, routes, spec)
    return Prepared("tiny", "static@r1", spec, list(range(PROMPT_TOKENS)), PROMPT_HASHES, 8, None, found, routes, {})  # type: ignore[arg-type]


async def test_a_routed_prompt_counts_as_cached_on_its_engine_before_any_kv_event(service) -> None:
    gateway, routes, spec = service
    first, second = sorted(routes)
    assert {n: c.view.cached_blocks for n, c in candidates(gateway, routes, spec).items()} == {first: 0, second: 0}
    prepared = prepared_for(gateway, routes, spec)
    ranked = next(r for r in gateway_rank(prepared) if r.engine_id == first)
    ticket = gateway.engines[first].start(Dispatcher._ticket(prepared, ranked, "whole-request", 8))
    assert ticket.prefill_tokens == PROMPT_TOKENS  # nothing was cached when it was routed
    later = candidates(gateway, routes, spec, [11, 12, 99])
    assert later[first].view.cached_blocks == 2 and later[second].view.cached_blocks == 0
    # ... and its queued work is priced: the prompt's 70 tokens wait on `first`
    assert later[first].view.queued_prefill_tokens == PROMPT_TOKENS
    gateway.engines[first].finish(ticket)
    assert candidates(gateway, routes, spec, [11, 12, 99])[first].view.cached_blocks == 0


async def test_a_ticket_queues_only_the_uncached_tail(service) -> None:
    gateway, routes, spec = service
    first = sorted(routes)[0]
    gateway.index.apply_batch(first, 0, EventBatch(ts=0.0, events=[BlockStored(block_hashes=[11, 12, 13], parent_block_hash=None,
                                                                               token_ids=[], block_size=16, lora_id=None)]))
    prepared = prepared_for(gateway, routes, spec)
    assert prepared.candidates[first].view.cached_blocks == 3
    ranked = next(r for r in gateway_rank(prepared) if r.engine_id == first)
    ticket = gateway.engines[first].start(Dispatcher._ticket(prepared, ranked, "whole-request", 8))
    assert (ticket.cached_tokens, ticket.prefill_tokens) == (48, PROMPT_TOKENS - 48)
    assert candidates(gateway, routes, spec)[first].view.queued_prefill_tokens == PROMPT_TOKENS - 48


def gateway_rank(prepared: Prepared):
    snapshot = RoutingSnapshot([c.view for c in prepared.candidates.values()])
    return rank_engines(RouteRequest(prepared.block_hashes, len(prepared.prompt_ids)), snapshot, ScorerPolicy())
