"""KV tiers end to end on real processes (controller, agents, gateway, tiny engines): a class with kv_tiers gets
its engines' evicted blocks into their node agent's tier, which each heartbeat reports (`fleetctl kv status`);
the gateway sees the tier hit (route explain); a prompt evicted from an engine comes back from the tier with the
same tokens; the other node's engine, routed to while that one is cordoned, fetches the blocks across nodes;
`fleetctl kv flush` empties the tier through the heartbeat and says how many blocks it dropped."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from fleet_helpers import controller, converged, wait_until
from typer.testing import CliRunner, Result

from engine.contract import parse_samples, sum_series
from fleetctl.cli.main import app

pytestmark = pytest.mark.slow

TIERS = {"dram_mib": 8, "disk_mib": 16}
TARGET = [(300 + 37 * i) % 40000 + 100 for i in range(150)]  # 9 full blocks of 16
FILLERS = [[(1000 + 53 * i + 7 * n) % 40000 + 100 for i in range(140)] for n in range(3)]


def greedy(url: str, prompt: list[int]) -> list[int]:
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "logprobs": 0,
            "return_tokens_as_token_ids": True}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return [int(t.removeprefix("token_id:")) for t in response.json()["choices"][0]["logprobs"]["tokens"]]


def fleetctl(record, *args: str) -> Result:
    token = Path(record.token_file).read_text().strip()
    result = CliRunner().invoke(app, ["--controller", record.controller_url, "--token", token, *args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def tier_blocks(api, node: str, class_name: str, tier: str) -> int:
    rows = [t for t in api.get_node(node).kv_tiers if t.class_name == class_name and t.tier == tier]
    return rows[0].blocks if rows else -1


def tier_candidate(record, engine: str) -> dict | None:
    """The engine's row in the gateway's explanation of TARGET, once it counts blocks in the node's DRAM tier."""
    body = {"model": record.served_model, "prompt": TARGET, "max_tokens": 8}
    answer = httpx.post(f"{record.gateway_url}/fleet/route/explain", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    row = next((c for c in answer.json()["candidates"] if c["engine"] == engine), None)
    return row if row is not None and row["tier_blocks"].get("CPU") else None


def cross_node_plan(record, engine: str) -> dict | None:
    """The gateway's cross-node plan for TARGET, once it is for `engine` (the one left to route to)."""
    body = {"model": record.served_model, "prompt": TARGET, "max_tokens": 8}
    answer = httpx.post(f"{record.gateway_url}/fleet/route/explain", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    plan = answer.json()["cross_node"]
    return plan if plan is not None and plan["engine"] == engine else None


def test_a_tiered_class_is_reported_served_from_its_tier_and_flushed(tiny_fleet) -> None:
    wait_until(lambda: converged(tiny_fleet, replicas=2), 120, "2 ready engines")
    with controller(tiny_fleet) as api:
        base = dict(api.get_class(tiny_fleet.class_ref).spec)
        name = tiny_fleet.class_ref.partition("@")[0]
        spec = {**base, "kv_tiers": TIERS, "engine_args": {**(base.get("engine_args") or {}), "num-blocks-override": 24}}
        ref = api.apply_class(name, spec).ref
        api.set_deployment("local", ref, 2, model=tiny_fleet.served_model, reason="test: KV tiers")
        engine = wait_until(lambda: next((e for e in api.list_engines() if e.class_ref == ref and e.state == "ready"),
                                         None), 180, f"a ready engine of {ref}")
        cold = greedy(engine.url, TARGET)
        for filler in FILLERS:  # 3 x 9 blocks through a 24-block pool: the target's blocks are evicted
            greedy(engine.url, filler)
        wait_until(lambda: tier_blocks(api, engine.node, name, "dram") >= 9, 60, "the tier's report on the node")
        explained = wait_until(lambda: tier_candidate(tiny_fleet, engine.name), 30, "the gateway to see the tier hit")
        assert explained["tier_blocks"]["CPU"] >= 8 and explained["tier_fetch_s"] > 0
        assert "in CPU tier" in explained["reason"]
        assert greedy(engine.url, TARGET) == cold
        samples = parse_samples(httpx.get(f"{engine.url}/metrics", timeout=10).text)
        assert sum_series(samples, "fleet_kv_tier_fetched_blocks_total") >= 9

        def reported_hits() -> dict | None:  # the fetch's hits arrive with the node's next heartbeat
            rows = json.loads(fleetctl(tiny_fleet, "kv", "status", engine.node, "-o", "json").stdout)
            dram = next(r for r in rows if r["class_name"] == name and r["tier"] == "dram")
            return dram if dram["hits"] >= 9 else None

        dram = wait_until(reported_hits, 30, "`kv status` to show the tier's hits")
        assert dram["blocks"] >= 9 and dram["offloaded"] >= 9 and dram["hit_rate"] > 0

        # the other node's engine, with the tier-holding engine cordoned, fetches the blocks across nodes
        other = next(e for e in api.list_engines() if e.class_ref == ref and e.state == "ready" and e.name != engine.name)
        assert other.node != engine.node
        api.cordon_engine(engine.name, reason="test: cross-node fetch")
        plan = wait_until(lambda: cross_node_plan(tiny_fleet, other.name), 30, "a cross-node plan for the other engine")
        assert plan["peer"] == engine.name and plan["peer_node"] == engine.node
        assert plan["blocks"] >= 8 and plan["measured"] is False
        # The verdict weighs the transfer (default link) against recomputing at the class's prefill rate: 2,000
        # tokens/s until the gateway has measured one, which makes the fetch win by a tenth; a measured rate of the
        # tiny model above ~2,200 tokens/s makes recomputing win. Which one it holds depends on its scrapes' timing.
        assert plan["fetch"] is (plan["with_s"] < plan["without_s"])
        body = {"model": tiny_fleet.served_model, "prompt": TARGET, "max_tokens": 8, "temperature": 0,
                "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True}
        if plan["fetch"]:  # the gateway sends the request with the peer to fetch from
            response = httpx.post(f"{tiny_fleet.gateway_url}/v1/completions", timeout=60, json=body)
        else:  # the same request as the gateway would send it had the fetch won
            transfer = {"tier_peer": engine.url, "tier_peer_node": engine.node}
            response = httpx.post(f"{other.url}/v1/completions", timeout=60, json={**body, "kv_transfer_params": transfer})
        assert response.status_code == 200, response.text
        assert [int(t.removeprefix("token_id:")) for t in response.json()["choices"][0]["logprobs"]["tokens"]] == cold
        samples = parse_samples(httpx.get(f"{other.url}/metrics", timeout=10).text)
        assert sum_series(samples, "fleet_kv_tier_peer_fetched_blocks_total", source=engine.node) >= 8
        api.uncordon_engine(engine.name, reason="test: done")

        said = fleetctl(tiny_fleet, "kv", "flush", engine.node, "--class", name, "--yes", "--reason", "test",
                        "--timeout", "60").stderr
        assert f"node {engine.node}: flushed" in said
        done = api.get_node(engine.node).kv_flushed
        assert done is not None and done.dropped[name] >= 9
        wait_until(lambda: tier_blocks(api, engine.node, name, "dram") == 0, 30, "the flushed tier's report")
