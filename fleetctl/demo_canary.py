"""The quality canary in `make demo`: record a golden set's reference from the revision serving the model,
show the healthy verdicts, misroute 15% of the traffic to a long-context build (RoPE scaling 4, a 8192-token
window: the same weights, different answers), watch the production stream alarm and name that build, stop
the drill and watch the verdict recover.

The demo's controller probes at a compressed interval (PROBE_ENV, passed to `fleetctl up`): a production
probe every quarter second instead of every 5 s, two in flight, pinned probes at batch 1 and 4 only, and no
budget throttle (the demo's fleet is idle by then: idle capacity costs nobody anything). The thresholds
still follow from one false alarm per 30 days per stream, at that interval: the wait is shorter, the rule
the same. The reference is recorded from 8 runs of each prompt (88 in all): the noise bound p0 the test
uses is an upper 95% confidence bound on those runs, so fewer runs would mean a higher p0 and a slower test. Every step is the command a user would type.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetctl.demo_rollout import apply_class, class_spec, run
from fleetctl.localfleet.processes import child_env, fleetctl_argv

GOLDEN = "smollm2-quick"  # the short-answer prompts of the shipped SmolLM2 set
PROBE_ENV = {
    "FLEET_CANARY_PRODUCTION_INTERVAL_S": "0.25",
    "FLEET_CANARY_PINNED_INTERVAL_S": "30",  # a pinned probe is a batch of golden prompts: rarely, on a 2-core machine
    "FLEET_CANARY_FLOOR_INTERVAL_S": "0.5",  # the demo fleet is idle by now: no busy capacity to budget against
    "FLEET_CANARY_BUDGET_SHARE": "1",
    "FLEET_CANARY_BATCH_CONDITIONS": "1,4",
    "FLEET_CANARY_MIN_PROBES": "5",
    "FLEET_CANARY_RECOVERY_PROBES": "10",
    "FLEET_CANARY_CONCURRENCY": "4",
}
ALARMS = ("drifting", "failing")
READY_TIMEOUT_S = 180.0
VERDICT_TIMEOUT_S = 150.0


def run_canary(fleet: dict[str, Any], env: dict[str, str], work_dir: Path) -> bool:
    """True when the misroute was detected, blamed on the long-context build, and the verdict recovered."""
    work_dir.mkdir(parents=True, exist_ok=True)
    model, gateway = fleet["served_model"], fleet["gateway_url"]
    serving = _heaviest(model, env)
    print(f"\n--- the quality canary: a golden set recorded from {serving}, probed all the time ---")
    long_ref = apply_class(work_dir / "class-long.yaml", f"{serving.split('@')[0]}-long",
                            {**class_spec(serving, env), "rope_scaling": 4.0, "max_model_len": 8192}, env)
    run(["deploy", "set", "long-context", "--class", long_ref, "--replicas", "1", "--reason", "demo: a long-context build"],
         env)
    _wait(lambda: _ready(long_ref, env), READY_TIMEOUT_S, f"an engine of {long_ref}")
    if run(["canary", "record", "--class", serving, "--golden", GOLDEN, "--gateway", gateway,
             "--repetitions", "8", "--conditions", "1"], env) != 0:
        return False
    healthy = _wait(lambda: _production(model, env).get("verdict") == "healthy", VERDICT_TIMEOUT_S,
                    "the production stream to be healthy")
    run(["canary", "status", model], env)

    print(f"\n--- drill: 15% of {model}'s traffic to {long_ref}; the canary must notice and name it ---")
    run(["drill", "misroute", "--model", model, "--to", long_ref, "--fraction", "0.15", "--duration", "5m",
          "--yes", "--reason", "demo: misroute drill"], env)
    started = time.monotonic()
    fired = _wait(lambda: _alarmed_on(model, long_ref, env), VERDICT_TIMEOUT_S, "the production stream to alarm")
    if fired:
        print(f"the canary fired {time.monotonic() - started:.0f} s into the drill and blamed {long_ref}")
    run(["canary", "status", model], env)
    run(["canary", "events", model], env)
    run(["drill", "stop", "--all", "--reason", "demo: drill over"], env)
    recovered = _wait(lambda: _production(model, env).get("verdict") == "healthy", VERDICT_TIMEOUT_S,
                      "the production stream to recover")
    run(["canary", "status", model], env)
    return healthy and fired and recovered


def _json(command: list[str], env: dict[str, str]) -> Any:
    result = subprocess.run(fleetctl_argv(*command, "-o", "json"), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=child_env(env))
    return json.loads(result.stdout) if result.returncode == 0 else None


def _heaviest(model: str, env: dict[str, str]) -> str:
    weights = (_json(["traffic", "get", model], env) or {}).get("weights", {})
    return max(sorted(weights), key=lambda ref: weights[ref])


def _ready(class_ref: str, env: dict[str, str]) -> bool:
    engines = _json(["engine", "list"], env) or []
    return any(e.get("class_ref") == class_ref and e.get("state") == "ready" for e in engines)


def _production(model: str, env: dict[str, str], served_by: str | None = None,
                streams: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The model's production stream, or the stream of the production probes `served_by` answered (of
    `streams` when given, else as `canary status` shows them now)."""
    streams = streams if streams is not None else _json(["canary", "status", model], env) or []
    return next((s for s in streams if s.get("kind") == "production" and s.get("class_ref") == served_by), {})


def _alarmed_on(model: str, class_ref: str, env: dict[str, str]) -> bool:
    """The production stream alarmed blaming `class_ref`, or the stream of what it served did."""
    streams = _json(["canary", "status", model], env) or []
    mixture = _production(model, env, streams=streams)
    if mixture.get("verdict") in ALARMS and (mixture.get("blamed") or "").split(" ")[0] == class_ref:
        return True
    return _production(model, env, served_by=class_ref, streams=streams).get("verdict") in ALARMS


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(1.0)
    print(f"gave up after {timeout_s:.0f} s waiting for {what}")
    return False
