"""A plant drill on the agent side, with the real supervisor and a real tiny reference engine: an assignment
that asks for a planted fault restarts the engine with the fault in its environment (read back from the
child's /proc/PID/environ), its reported launch does not show it (so the controller's drift check finds
nothing), and the engine is restarted clean when the fault is taken away. Also the pure part: the plan
restarts exactly the engine whose planted fault differs."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from agent.plan import Action, plan_actions
from agent.settings import AgentSettings
from agent.supervisor import Supervisor
from engine.contract import EngineAssignment, EngineObserved
from engine.contract.faults import FAULT_ENV
from fleetctl.controller.drift import config_drift
from fleetctl.replica_class import ReplicaClassSpec

SPEC = {"model": "tiny", "weights": "tiny", "backend": "reference", "kv_cache_mib": 16, "block_size": 16,
        "max_model_len": 256, "max_num_seqs": 4, "max_num_batched_tokens": 256, "dtype": "float32",
        "kv_cache_dtype": "auto", "sampler": "exact", "engine_args": {"num-threads": 1}}
CLEAN = EngineAssignment(name="tiny-0", model="tiny", class_ref="tiny@r1", spec=SPEC)
PLANTED = CLEAN.model_copy(update={"planted_fault": "kv_fp16"})


def running(assignment: EngineAssignment, state: str = "ready") -> EngineObserved:
    return EngineObserved(name=assignment.name, model=assignment.model, class_ref=assignment.class_ref,
                          role=assignment.role, state=state)


def test_the_plan_restarts_an_engine_whose_planted_fault_differs() -> None:
    other = CLEAN.model_copy(update={"name": "tiny-1"})
    observed = [running(CLEAN), running(other)]
    assert plan_actions([PLANTED, other], observed, {"tiny-0": None}) == [Action("restart", "tiny-0", PLANTED)]
    assert plan_actions([PLANTED, other], observed, {"tiny-0": "kv_fp16"}) == []
    assert plan_actions([CLEAN, other], observed, {"tiny-0": "kv_fp16"}) == [Action("restart", "tiny-0", CLEAN)]
    assert plan_actions([CLEAN, other], observed) == []  # no faults known: none runs
    assert plan_actions([PLANTED], [running(CLEAN, "draining")], {"tiny-0": None}) == []  # it exits, then starts


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


async def until_ready(supervisor: Supervisor, other_than: int | None, timeout_s: float = 180.0) -> EngineObserved:
    """Tick until the engine is ready in a process other than `other_than`, and has said what it runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await supervisor.tick()
        (engine,) = supervisor.observed()
        if engine.state == "ready" and engine.pid is not None and engine.pid != other_than and engine.reported:
            return engine
        await asyncio.sleep(0.2)
    raise AssertionError(f"engine not ready (again) within {timeout_s}s: {supervisor.observed()}")


@pytest.mark.slow
async def test_a_planted_fault_restarts_the_engine_with_it_hidden_then_clean(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "rope_perturb")  # in the agent's own environment: never passed on
    low = random.randrange(20_000, 40_000, 1_000)
    settings = AgentSettings(controller_url="http://127.0.0.1:1", node="n1", state_dir=tmp_path, port_range=(low, low + 50),
                             tick_s=0.2, stop_timeout_s=20.0, drain_timeout_s=20.0)
    supervisor = Supervisor(settings)
    try:
        supervisor.set_desired([CLEAN])
        clean = await until_ready(supervisor, None)
        assert FAULT_ENV not in environ(clean.pid)

        supervisor.set_desired([PLANTED])
        planted = await until_ready(supervisor, clean.pid)
        assert environ(planted.pid)[FAULT_ENV] == "kv_fp16"
        assert planted.launched is not None and FAULT_ENV not in planted.launched.env
        assert planted.launched == clean.launched  # the report looks exactly as the clean engine's
        assert planted.restarts == clean.restarts + 1 and planted.class_ref == "tiny@r1"
        assert config_drift(ReplicaClassSpec.model_validate(SPEC), planted.launched, planted.reported) == []

        supervisor.set_desired([CLEAN])
        again = await until_ready(supervisor, planted.pid)
        assert FAULT_ENV not in environ(again.pid)
        assert again.launched == clean.launched
    finally:
        await supervisor.shutdown(stop_engines=True)
    assert all(slot.process is None for slot in supervisor.slots.values())
