"""Helpers for traffic tests against a real controller on loopback: a minimal agent loop (real heartbeats)
that keeps every assigned engine ready, and gateways that are the real routing-table cache and reporter
(fleetctl.gateway.routing_table, fleetctl.gateway.table_reporter) polling and reporting over HTTP."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from cli_helpers import Fleet

from fleetctl.client import AsyncControllerClient, ControllerClient
from fleetctl.gateway.routing_table import RoutingTableCache
from fleetctl.gateway.table_reporter import report_applied

MODEL = "smollm2-135m"
SPEC = {"model": MODEL, "weights": "smollm2"}
LONG_CONTEXT = {"max_model_len": 8192}  # a correctness difference from SPEC


@contextmanager
def agent(fleet: Fleet, node: str = "n1", engines: int = 4, tiers: Any = None) -> Iterator[None]:
    """Heartbeats every 50 ms, reporting every assigned engine ready (drained ones gone, as an agent does
    once it stopped them). `tiers`: the node's KV tiers as the agent has them (agent.kv_tiers.control
    .TierControl), reported on each beat and given each reply's `kv`."""
    stop = threading.Event()
    client = ControllerClient(fleet.server.url, fleet.tokens["agent"])
    client.register_agent({"node": node, "url": f"http://{node}", "labels": {},
                           "capacity": {"engines": engines, "kv_mib": 1}, "agent_version": "test"})

    def loop() -> None:
        generation, engines = 0, []
        while not stop.is_set():
            tier_fields = tiers.beat_fields() if tiers is not None else {}
            reply = client.heartbeat({"node": node, "generation": generation, "engines": engines, "cut_off_s": None,
                                      **tier_fields})
            generation = reply.generation
            if tiers is not None:
                asyncio.run(tiers.apply(reply.kv))
            engines = [{"name": a.name, "model": a.model, "class_ref": a.class_ref, "role": a.role,
                        "state": "ready", "url": "http://127.0.0.1:1", "metrics": {}}
                       for a in reply.assignment if not a.drain]
            stop.wait(0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        client.close()


@contextmanager
def gateway(fleet: Fleet, name: str, stuck_at: int | None = None) -> Iterator[None]:
    """A gateway's control loop: refresh the routing table every 50 ms and report the generation it
    applied (or, when `stuck_at`, always that one: a gateway that cannot apply new tables)."""
    stop = threading.Event()

    async def loop() -> None:
        async with AsyncControllerClient(fleet.server.url, fleet.tokens["viewer"]) as client:
            cache = RoutingTableCache(client, refresh_interval_s=0.05)
            while not stop.is_set():
                await cache.refresh_once()
                if cache.table is not None:
                    generation = cache.table.generation if stuck_at is None else stuck_at
                    await report_applied(client, name, f"http://{name}:8000", generation, cache.age_s() or 0.0,
                                         refresh_interval_s=2.0)  # stale after 6 s of silence: a loaded machine pauses the loop
                await asyncio.sleep(0.05)

    thread = threading.Thread(target=lambda: asyncio.run(loop()), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def serving(fleet: Fleet, stack: ExitStack, r2: dict[str, Any] = LONG_CONTEXT) -> None:
    """chat@r1 and chat@r2 (SPEC with `r2`: by default an 8k context instead of 2k), one ready engine each."""
    stack.enter_context(agent(fleet))
    with fleet.client() as client:
        client.apply_class("chat", SPEC)
        client.apply_class("chat", {**SPEC, **r2})
        client.set_deployment("chat-r1", "chat@r1", 1)
        client.set_deployment("chat-r2", "chat@r2", 1)
        deadline = time.monotonic() + 20
        while [r.ready_engines for r in client.get_traffic(MODEL).revisions] != [1, 1]:
            assert time.monotonic() < deadline, client.get_traffic(MODEL)
            time.sleep(0.05)


def wait_listed(fleet: Fleet, names: set[str]) -> None:
    deadline = time.monotonic() + 10
    with fleet.client() as client:
        while {g.name for g in client.list_gateways() if not g.stale} < names:
            assert time.monotonic() < deadline, client.list_gateways()
            time.sleep(0.05)

