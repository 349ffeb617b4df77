"""A real controller and two real agents running tiny engines: the assignment converges, and an engine
killed with SIGKILL is restarted by its agent and reported (restarts, last_exit)."""

from __future__ import annotations

import os
import signal

import pytest
from fleet_helpers import complete, controller, converged, engines_by_name, wait_until

pytestmark = pytest.mark.slow


def test_assignment_converges_one_engine_per_node(tiny_fleet):
    engines = wait_until(lambda: converged(tiny_fleet, replicas=2), 60, "2 ready engines")
    assert sorted(engines) == ["local-0", "local-1"]
    assert {e["node"] for e in engines.values()} == {"node-1", "node-2"}  # spread over the nodes
    for engine in engines.values():
        assert engine["class_ref"] == "tiny@r1" and engine["role"] == "mixed"
        assert engine["url"] and engine["kv_events_endpoint"].startswith("tcp://127.0.0.1:")
        assert engine["port"] == int(engine["url"].rsplit(":", 1)[1])
        assert complete(engine["url"])["choices"][0]["text"]
    with controller(tiny_fleet) as api:
        nodes = {n.name: n for n in api.list_nodes()}
    assert all(n.applied_generation == n.generation for n in nodes.values())


def test_agents_report_what_they_run_and_scrape_metrics(tiny_fleet):
    wait_until(lambda: converged(tiny_fleet, replicas=2), 60, "2 ready engines")
    url = engines_by_name(tiny_fleet)["local-0"]["url"]
    prompt = "the same long prompt, sent three times, fills two blocks of sixteen tokens " * 3
    for _ in range(3):
        complete(url, prompt=prompt)
    # the repeated prompt hits the prefix cache; the agent's next scrape of /metrics shows it
    local0 = wait_until(lambda: (e := engines_by_name(tiny_fleet)["local-0"])["metrics"]["prefix_cache_hits"] > 0 and e,
                        30, "scraped prefix-cache counters")
    assert local0["metrics"]["prefix_cache_queries"] >= local0["metrics"]["prefix_cache_hits"]
    assert local0["port"] and local0["port"] + 1 == int(local0["kv_events_endpoint"].rsplit(":", 1)[1])


def test_engine_killed_with_sigkill_is_restarted_and_reported(tiny_fleet):
    wait_until(lambda: converged(tiny_fleet, replicas=2), 60, "2 ready engines")
    before = engines_by_name(tiny_fleet)["local-1"]
    os.kill(before["pid"], signal.SIGKILL)

    def restarted():
        with controller(tiny_fleet) as api:
            engine = api.get_engine("local-1").model_dump()
        return engine if engine["state"] == "ready" and engine["pid"] != before["pid"] else None

    after = wait_until(restarted, 90, "local-1 restarted and reported ready")
    assert after["restarts"] == before["restarts"] + 1
    assert after["last_exit"] == "signal SIGKILL"
    assert after["url"] == before["url"]  # its ports were free again, so its URL is kept
    assert complete(after["url"])["choices"]
    assert engines_by_name(tiny_fleet)["local-0"]["restarts"] == 0  # the other engine was not touched


def test_engines_the_agents_launch_report_their_launch_and_config_and_do_not_drift(tiny_fleet):
    wait_until(lambda: converged(tiny_fleet, replicas=2), 60, "2 ready engines")
    engine = engines_by_name(tiny_fleet)["local-0"]
    assert engine["launched"]["argv"][1:3] == ["-m", "engine.reference"]
    assert "PYTHONPATH" in engine["launched"]["env"]
    with controller(tiny_fleet) as api:
        checked = wait_until(lambda: (d := api.live_drift(model="tiny")) and all(len(e.checked) == 2 for e in d) and d,
                             30, "both engines' launch and config reported")
        assert [(e.name, e.drifted) for e in checked] == [("local-0", False), ("local-1", False)]
        assert api.status().drifted == 0
