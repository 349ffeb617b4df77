"""P:D rebalances end to end on real controller, agent, gateway and tiny engine processes: a mixed-only model
turned into P/D and rebalanced under traffic through the gateway, dropping no request and never going
below a role's floor; a freeze holds it; a controller killed mid-flip resumes the same flip (no engine is
flipped twice); a prefill engine holding K/V for a pending handoff is not stopped until the handoff is done."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from fleet_helpers import (
    Traffic, controller, engines_by_name, kill, process, restart_controller, start_tiny_fleet, wait_until,
)

from fleetctl.gateway.pd import PREFILL_KV_PARAMS
from fleetctl.localfleet import FleetRecord, down

pytestmark = pytest.mark.slow

MODEL = "tiny"


@pytest.fixture(scope="module")
def pd_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetRecord]:
    """Two agents; the default deployment scaled to three mixed engines."""
    state_dir = tmp_path_factory.mktemp("pd-fleet")
    record = start_tiny_fleet(state_dir)
    with controller(record) as api:
        api.set_deployment("local", record.class_ref, 3, reason="test: three engines")
    wait_until(lambda: ratio_of(record) == {"prefill": 0, "decode": 0, "mixed": 3} and ready_count(record) == 3,
               120, "three mixed engines ready")
    yield record
    down(state_dir, timeout_s=30.0)


def ratio_of(record: FleetRecord) -> dict[str, int]:
    with controller(record) as api:
        (model,) = api.pd_status(MODEL)
    return model.ratio.model_dump()


def ready_count(record: FleetRecord) -> int:
    return sum(1 for e in engines_by_name(record).values() if e["state"] == "ready")


def rebalance(record: FleetRecord, prefill: int, decode: int, mixed: int | None = None) -> int:
    with controller(record) as api:
        started = api.pd_rebalance(MODEL, prefill, decode, mixed=mixed, apply=True, baseline_s=0,
                                   ttft_slo_s=30.0, itl_slo_s=5.0, reason="test")
    assert started.rebalance is not None
    return started.rebalance.id


def view(record: FleetRecord, rebalance_id: int):
    with controller(record) as api:
        return api.get_rebalance(rebalance_id)


def finished(record: FleetRecord, rebalance_id: int, timeout_s: float = 240):
    return wait_until(lambda: (v := view(record, rebalance_id)).phase in ("completed", "stopped") and v, timeout_s,
                      f"rebalance {rebalance_id} to finish")


def serving_roles(record: FleetRecord) -> dict[str, int]:
    """Ready engines per role, as the agents report them."""
    counts = {"prefill": 0, "decode": 0, "mixed": 0}
    for engine in engines_by_name(record).values():
        if engine["state"] == "ready":
            counts[engine["role"]] += 1
    return counts


def test_mixed_to_pd_and_a_rebalance_under_traffic_drop_nothing_and_keep_the_floors(pd_fleet: FleetRecord) -> None:
    assert pd_fleet.gateway_url is not None
    with Traffic([pd_fleet.gateway_url]) as traffic:
        first = rebalance(pd_fleet, prefill=1, decode=2, mixed=0)
        done = finished(pd_fleet, first)
        assert done.phase == "completed", done.message
        assert ratio_of(pd_fleet) == {"prefill": 1, "decode": 2, "mixed": 0}
        wait_until(lambda: serving_roles(pd_fleet) == {"prefill": 1, "decode": 2, "mixed": 0}, 60, "1P:2D serving")

        second = rebalance(pd_fleet, prefill=2, decode=1)
        seen: list[dict[str, int]] = []
        while (current := view(pd_fleet, second)).phase not in ("completed", "stopped"):
            seen.append(serving_roles(pd_fleet))
            time.sleep(0.3)
        assert current.phase == "completed", current.message
        sent_during = traffic.ok
    assert traffic.failed == [], traffic.failed[:3]
    assert sent_during > 20
    assert all(r["prefill"] >= 1 and r["decode"] >= 1 for r in seen[1:]), seen  # the floors hold throughout
    assert len({f.engine for f in current.flips}) == len(current.flips) == 1


def test_a_freeze_holds_the_rebalance_and_it_continues_when_lifted(pd_fleet: FleetRecord) -> None:
    wait_until(lambda: serving_roles(pd_fleet) == {"prefill": 2, "decode": 1, "mixed": 0}, 60, "2P:1D serving")
    with controller(pd_fleet) as api:
        api.freeze(reason="test: incident")
    try:
        with controller(pd_fleet) as api:
            refused = None
            try:
                api.pd_rebalance(MODEL, 1, 2, apply=True, reason="test")
            except Exception as exc:  # noqa: BLE001 - the refusal is what the test checks
                refused = exc
        assert refused is not None and getattr(refused, "code", "") == "frozen"
    finally:
        with controller(pd_fleet) as api:
            api.unfreeze(reason="test: over")
    rebalance_id = rebalance(pd_fleet, prefill=1, decode=2)
    with controller(pd_fleet) as api:
        api.freeze(reason="test: mid-rebalance")
    try:
        held = wait_until(lambda: (v := view(pd_fleet, rebalance_id)).paused_by == "freeze" and v, 30, "the hold")
        flips_when_held = len(held.flips)
        time.sleep(3)
        assert len(view(pd_fleet, rebalance_id).flips) == flips_when_held  # nothing new starts while frozen
    finally:
        with controller(pd_fleet) as api:
            api.unfreeze(reason="test: lifted")
    done = finished(pd_fleet, rebalance_id)
    assert done.phase == "completed" and any(e.event == "resumed" for e in done.events)


def test_a_controller_killed_mid_flip_resumes_the_same_flip(pd_fleet: FleetRecord) -> None:
    wait_until(lambda: serving_roles(pd_fleet) == {"prefill": 1, "decode": 2, "mixed": 0}, 60, "1P:2D serving")
    rebalance_id = rebalance(pd_fleet, prefill=2, decode=1)
    flipping = wait_until(lambda: (v := view(pd_fleet, rebalance_id)).flips and v, 60, "the flip to start")
    engine = flipping.flips[0].engine
    kill(process(pd_fleet, "controller"))
    restart_controller(pd_fleet)
    done = finished(pd_fleet, rebalance_id)
    assert done.phase == "completed", done.message
    assert [f.engine for f in done.flips] == [engine]
    assert [e.event for e in done.events].count("flip_started") == 1


def test_a_prefill_engine_holding_kv_for_a_handoff_stops_only_once_it_is_released(pd_fleet: FleetRecord) -> None:
    wait_until(lambda: serving_roles(pd_fleet) == {"prefill": 2, "decode": 1, "mixed": 0}, 60, "2P:1D serving")
    engines = engines_by_name(pd_fleet)
    prefill = sorted(name for name, e in engines.items() if e["role"] == "prefill" and e["state"] == "ready")
    # hold K/V on every prefill engine, as a prefill whose decode has not pulled yet does
    handles = {}
    for name in prefill:
        body = {"model": MODEL, "prompt": "a prompt long enough to fill a block or two " * 4, "max_tokens": 1,
                "kv_transfer_params": dict(PREFILL_KV_PARAMS)}
        response = httpx.post(f"{engines[name]['url']}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        handles[name] = response.json()["kv_transfer_params"]["remote_request_id"]
    rebalance_id = rebalance(pd_fleet, prefill=1, decode=2)
    flipping = wait_until(lambda: (v := view(pd_fleet, rebalance_id)).flips and v, 60, "the flip to start")
    engine = flipping.flips[0].engine
    assert engine in prefill
    wait_until(lambda: engines_by_name(pd_fleet).get(engine, {}).get("state") == "draining", 30, f"{engine} draining")
    time.sleep(3)
    assert engines_by_name(pd_fleet)[engine]["state"] == "draining"  # the pending handoff keeps it up
    assert view(pd_fleet, rebalance_id).flips[0].phase == "draining"
    released = httpx.post(f"{engines[engine]['url']}/kv/release", json={"request_id": handles[engine]}, timeout=10)
    assert released.status_code == 200 and released.json()["released"] is True
    done = finished(pd_fleet, rebalance_id)
    assert done.phase == "completed", done.message
    for name, request_id in handles.items():
        if name != engine:
            httpx.post(f"{engines[name]['url']}/kv/release", json={"request_id": request_id}, timeout=10)


def test_pd_profile_measures_an_engine_and_the_planner_uses_it(pd_fleet: FleetRecord) -> None:
    from typer.testing import CliRunner

    from fleetctl.cli.main import app

    token = open(pd_fleet.token_file).read().strip()
    result = CliRunner().invoke(app, ["--controller", pd_fleet.controller_url, "--token", token, "pd", "profile",
                                      pd_fleet.class_ref, "--prefill-concurrency", "1,2", "--decode-concurrency", "1,2",
                                      "--prompt-words", "32", "--output-tokens", "8", "--ttft-slo", "30",
                                      "--itl-slo", "5", "--reason", "test", "-o", "json"])
    assert result.exit_code == 0, result.output
    import json
    stored = json.loads(result.stdout)
    assert stored["prefill_tokens_per_s"] > 0 and stored["decode_slots"] >= 1
    assert 0 < stored["decode_itl_s"] <= 5  # the ITL measured at those slots, within the SLO
    assert [p["concurrency"] for p in stored["detail"]["prefill"]] == [1, 2]
    with controller(pd_fleet) as api:
        (model,) = api.pd_status(MODEL)
    assert model.profile["source"].startswith("profiled ")
    assert model.profile["prefill_tokens_per_s"] == stored["prefill_tokens_per_s"]
