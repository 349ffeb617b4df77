"""The quality canary end to end, at a compressed probe rate: a real controller probing through a real gateway
into real tiny engines, a reference recorded with `fleetctl canary record`, then drills.

- A misroute of part of the model's traffic to a correctness-different class (a long-context build with RoPE
  scaling, a float16 KV cache, the approximate top-k sampler) makes the production stream alarm and blame
  that class; when the drill stops, the stream recovers.
- A fault planted in one engine of the healthy class (RoPE perturbed; its configuration still reports clean)
  makes a stream alarm and name that engine; when the drill stops, the engine is restarted clean and the
  class recovers. (That every planted fault changes answers is tested in-process: tests/engine.)

The approximate top-k sampler is wrong only at batch sizes of 4 and more. A production fleet's traffic keeps a
misrouted class that busy; here load pinned to it does (`BusyClass`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.rollout_proc.rollout_fleet import MODEL, FleetOptions, RolloutFleet, start_fleet, stop_fleet, wait_until

pytestmark = pytest.mark.slow

BASE = {"model": MODEL, "weights": "tiny", "kv_cache_mib": 16, "max_num_seqs": 16}
CLASSES = {
    "A": BASE,
    "LONG": {**BASE, "rope_scaling": 4.0, "max_model_len": 8192},
    "KV16": {**BASE, "kv_cache_dtype": "float16"},
    "TOPK": {**BASE, "sampler": "approximate_topk"},
}
# Compressed: probes as fast as two cores allow, and thresholds that follow from one false alarm per day per
# stream at these intervals (the default is 30 days at a 5 s / 60 s interval).
CONTROLLER_ARGS = (
    "--canary-production-interval", "0.2", "--canary-pinned-interval", "2", "--canary-floor-interval", "2",
    "--canary-false-alarm-days", "1", "--canary-min-probes", "5", "--canary-recovery-probes", "10",
    "--canary-concurrency", "4", "--canary-timeout", "30",
)
GOLDEN = Path(__file__).with_name("tiny-quick.yaml")
ALARMS = ("drifting", "failing")
# The tests are tuned to a 15% shift; the drills send more, so that they are caught in fewer probes on two cores
# (benchmarks/canary.py measures 15% at the default rate): half, the most a drill sends (at 30% a detection took
# 80-95 s of probing here).
FRACTION = {"LONG": 0.5, "KV16": 0.5, "TOPK": 0.5}
DETECT_S = 240.0
RECOVER_S = 180.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutFleet]:
    """A: two engines with all the traffic, and a reference recorded from it. The correctness-different
    classes are applied; each test deploys the one it misroutes to (one engine) and removes it after."""
    options = FleetOptions(nodes=2, replicas=2, classes=CLASSES, controller_args=CONTROLLER_ARGS)
    started = start_fleet(tmp_path_factory.mktemp("canary-fleet"), options)
    try:
        recorded = started.cli("canary", "record", "--class", started.refs["A"], "--golden", str(GOLDEN),
                               "--gateway", started.gateway_url, "--repetitions", "2", "--conditions", "1,4",
                               timeout_s=240)
        assert recorded.returncode == 0, recorded.stderr
        wait_until(lambda: healthy(started), 180, "the production stream and A's b1 stream to be healthy")
        yield started
    finally:
        stop_fleet(started)


@contextmanager
def deployed(fleet: RolloutFleet, key: str) -> Iterator[str]:
    """One engine of class `key` at weight 0 while the block runs; its deployment scaled to 0 after."""
    ref = fleet.refs[key]
    with fleet.client() as api:
        api.set_deployment(key.lower(), ref, replicas=1, reason="canary test")
    try:
        wait_until(lambda: fleet.gateway_routes(ref, 1), 240, f"the gateway to route to {key}")
        yield ref
    finally:
        with fleet.client() as api:
            api.set_deployment(key.lower(), ref, replicas=0, reason="canary test: done")


def streams(fleet: RolloutFleet) -> list[Any]:
    with fleet.client() as api:
        return api.canary_status(model=MODEL)


def production(fleet: RolloutFleet) -> Any:
    return next(s for s in streams(fleet) if s.kind == "production")


def healthy(fleet: RolloutFleet) -> bool:
    """The production stream and one of A's pinned streams are healthy (a pinned probe is filed under the batch
    the engine really ran it at, so which of A's streams fill first depends on the load)."""
    found = streams(fleet)
    return (any(s.kind == "production" and s.verdict == "healthy" for s in found)
            and any(s.class_ref == fleet.refs["A"] and s.verdict == "healthy" for s in found))


def a_streams_healthy(fleet: RolloutFleet) -> bool:
    return all(s.verdict not in ALARMS for s in streams(fleet) if s.class_ref in (fleet.refs["A"], None))


class BusyClass:
    """Streams pinned to one class revision, `clients` at a time, so its running batch stays at 4 or more."""

    def __init__(self, fleet: RolloutFleet, class_ref: str, clients: int = 4):
        self.url, self.class_ref, self.clients = f"{fleet.gateway_url}/v1/completions", class_ref, clients
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> "BusyClass":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _loop(self, worker: int) -> None:
        body = {"model": MODEL, "prompt": f"Load {worker}: the river runs past", "max_tokens": 256,
                "ignore_eos": True, "temperature": 0}
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                try:
                    client.post(self.url, json=body, headers={"x-fleet-pin-class": self.class_ref})
                except httpx.HTTPError:
                    self._stop.wait(0.2)


def stop_drills(fleet: RolloutFleet) -> None:
    with fleet.client() as api:
        api.stop_all_drills(reason="canary test: done")


@pytest.mark.parametrize("target", ["LONG", "KV16", "TOPK"])
def test_a_misroute_to_a_correctness_different_class_alarms_and_blames_it(fleet: RolloutFleet, target: str) -> None:
    with deployed(fleet, target) as to, (BusyClass(fleet, to) if target == "TOPK" else nullcontext()):
        try:
            with fleet.client() as api:
                api.start_misroute_drill(MODEL, to, FRACTION[target], 600, reason=f"canary test: misroute to {target}")
            wait_until(lambda: (s := production(fleet)).verdict in ALARMS and (s.blamed or "").split(" ")[0] == to,
                       DETECT_S, f"the production stream to alarm and blame {to}", every_s=0.5)
        finally:
            stop_drills(fleet)
    with fleet.client() as api:
        alerts = [e for e in api.canary_events(model=MODEL, limit=200)
                  if e.kind == "production" and e.verdict_to in ALARMS]
    assert alerts and to in alerts[-1].message
    wait_until(lambda: production(fleet).verdict == "healthy", RECOVER_S, "the production stream to recover",
               every_s=0.5)


def test_a_fault_planted_in_one_engine_alarms_and_names_the_engine(fleet: RolloutFleet) -> None:
    a = fleet.refs["A"]
    engine = sorted(e["name"] for e in fleet.ready_engines(a))[0]
    try:
        with fleet.client() as api:
            api.start_plant_drill(engine, "rope_perturb", 600, reason="canary test: plant rope_perturb")
        # the pinned streams walk A's engines, so half their probes land on the planted one
        wait_until(lambda: any(s.verdict in ALARMS and s.blamed == f"{a} {engine}" for s in streams(fleet)),
                   DETECT_S, f"a stream to alarm naming {a} {engine}", every_s=0.5)
        with fleet.client() as api:  # the point of the drill: the engine's reported configuration looks clean
            assert not [d.name for d in api.live_drift(model=MODEL) if d.drifted]
    finally:
        stop_drills(fleet)
    wait_until(lambda: len(fleet.ready_engines(a)) == 2 and a_streams_healthy(fleet), RECOVER_S,
               f"{a}'s engines back and its streams recovered", every_s=1.0)
