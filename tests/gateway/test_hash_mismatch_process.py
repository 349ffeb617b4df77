"""The gateway flags an engine whose prefix hashes use another seed, from the engine's own KV events: two real
reference engines, one started with the gateway's seed and one with the fleet's old default, behind a real
gateway (static table)."""

from __future__ import annotations

import pytest
from gateway.procs import Launcher, static_entry, wait_until
from prometheus_client.parser import text_string_to_metric_families

from engine.hashing import LEGACY_HASH_SEED, VLLM_DEFAULT_HASH_SEED
from fleetctl.gateway.hash_check import MISMATCHES_TO_FLAG


@pytest.fixture(scope="module")
def fleet(launcher: Launcher):
    same = launcher.engine("--hash-seed", VLLM_DEFAULT_HASH_SEED, kv_events=True)
    other = launcher.engine("--hash-seed", LEGACY_HASH_SEED, kv_events=True)
    gateway = launcher.gateway("--engines", f"{static_entry(same)},{static_entry(other)}", "--hash-seed",
                               VLLM_DEFAULT_HASH_SEED)
    return gateway, same, other


def mismatch_gauge(gateway) -> dict[str, float]:
    text = gateway.get("/metrics").text
    return {s.labels["engine"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "fleet_gateway_engine_hash_mismatch"}


def test_the_engine_with_another_seed_is_flagged_and_the_matching_one_is_not(fleet):
    gateway, same, other = fleet
    same_name, other_name = f"127.0.0.1:{same.port}", f"127.0.0.1:{other.port}"  # static-table engine names
    for i in range(MISMATCHES_TO_FLAG):  # distinct prompts of two full blocks each, straight to each engine
        body = {"prompt": [200 + 50 * i + j for j in range(40)], "max_tokens": 1, "temperature": 0}
        for engine in (same, other):
            assert engine.post("/v1/completions", body).status_code == 200
    wait_until(lambda: mismatch_gauge(gateway).get(other_name) == 1.0, 30.0, "the other seed flagged")
    assert mismatch_gauge(gateway)[same_name] == 0.0
    explained = gateway.post("/fleet/route/explain", {"model": "tiny", "prompt": "hello"}).json()
    rows = {row["engine"]: row["prefix_hashes"] for row in explained["candidates"] + explained["ineligible"]}
    assert rows == {same_name: "match", other_name: "hash_mismatch"}
