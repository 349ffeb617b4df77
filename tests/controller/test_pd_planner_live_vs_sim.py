"""The planner decides the same live and in the simulator on the same snapshot: the controller's planner
reconciler, reading engine counters from heartbeats in the store (SQLite and PostgreSQL), and the
simulator's control, reading the same counters from simulated engines, build the same Load and Snapshot
and get the same Recommendation."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ctl_helpers import Api, apply_class, beat, deploy, register

from fleetctl.controller.pd_planner_reconciler import PdPlannerReconciler
from fleetctl.pd.load import LoadTracker
from fleetctl.pd.planner import Gates, PlannerSettings, Snapshot, plan
from fleetctl.sim import REFERENCE_SMOLLM2_CPU, FleetShape, RequestSpec, admit_all_policy, simulate
from fleetctl.sim.fleet import Fleet
from fleetctl.sim.pd_control import EPOCH, MODEL, ratio, readings, sim_profile

MODEL_NAME = "smollm2-135m"


def simulated_readings() -> tuple[Any, Any, Fleet]:
    """Two readings of a simulated 1P:3D fleet, 20 s apart, under a steady workload."""
    shape = FleetShape(1, 3, REFERENCE_SMOLLM2_CPU, max_num_seqs=16)
    work = [RequestSpec(i, i * 0.5, 120, 30, 30) for i in range(80)]
    taken: list[Any] = []
    fleets: list[Fleet] = []

    def control(fleet: Fleet) -> None:
        if fleet.now in (10.0, 30.0):
            taken.append(readings(fleet))
            fleets.append(fleet)

    simulate(work, shape, admit_all_policy(), 40.0, control=control)
    return taken[0], taken[1], fleets[0]


def engine_report(assignment: dict[str, Any], counters: dict[str, float], waiting: int, running: int) -> dict[str, Any]:
    return {"name": assignment["name"], "model": assignment["model"], "class_ref": assignment["class_ref"],
            "role": assignment["role"], "state": "ready", "pid": 42, "port": 8100, "url": "http://127.0.0.1:8100",
            "metrics": {**counters, "num_requests_waiting": waiting, "num_requests_running": running}}


def test_the_same_counters_give_the_same_recommendation_live_and_simulated(api: Api) -> None:
    first, second, fleet = simulated_readings()
    register(api, "n1", engines=8)
    apply_class(api)
    deploy(api, "chat-prefill", "chat@r1", 1, role="prefill")
    deploy(api, "chat-decode", "chat@r1", 3, role="decode")
    api.reconcile()
    assignment = beat(api, "n1")["assignment"]
    by_role: dict[str, list[dict[str, Any]]] = {}
    for a in assignment:
        by_role.setdefault(a["role"], []).append(a)

    def report(reading: Any, generation: int) -> None:
        sim = {"prefill": [e for e in reading.engines if e.role == "prefill"],
               "decode": [e for e in reading.engines if e.role == "decode"]}
        engines = [engine_report(a, dict(e.counters), e.waiting, e.running)
                   for role in ("prefill", "decode") for a, e in zip(by_role[role], sim[role])]
        beat(api, "n1", generation, engines)
        api.runtime.flush_heartbeats()  # buffered heartbeats reach the store

    generation = beat(api, "n1")["generation"]
    settings = PlannerSettings()
    reconciler = PdPlannerReconciler(interval_s=2.0)
    api.clock.now = EPOCH + timedelta(seconds=10)
    report(first, generation)
    with api.runtime.store.session() as session:
        reconciler.snapshot(session, api.clock.now)
    api.clock.now = EPOCH + timedelta(seconds=30)
    report(second, generation)
    with api.runtime.store.session() as session:
        (item,) = reconciler.snapshot(session, api.clock.now)
    live = reconciler.decide((item,), api.clock.now).recommendations[0]

    tracker = LoadTracker()
    tracker.observe(MODEL, first)
    tracker.observe(MODEL, second)
    load, _ = tracker.load(MODEL)
    profile = item.snapshot.profile  # the class's (default) profile, as the simulator would be given it
    simulated = plan(Snapshot(MODEL_NAME, ratio(fleet), load, profile, Gates()), settings, api.clock.now)

    assert item.snapshot.load == load, (item.snapshot.load, load)  # the same load, from the store and from the simulated engines
    assert item.snapshot.current == ratio(fleet)
    assert (live.recommended, live.action, live.reasons) == (simulated.recommended, simulated.action, simulated.reasons)
    assert load.arrival_rps > 0 and load.mean_output_tokens > 0  # it measured something
    assert sim_profile(REFERENCE_SMOLLM2_CPU, 16, 0.3).decode_slots >= 1
