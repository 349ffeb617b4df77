"""Engines fleetctl did not launch (a vLLM server already running somewhere), brought into the fleet.

`fleetctl engine adopt URL --model M --class NAME@rN` registers one. The controller probes it first
(`probe_engine`: `/v1/models`, `/metrics`, and the engine's own account of its settings, asked as an agent asks
an engine it launched: engine.contract.reported) and refuses it, naming the field, when (`refusal`):
- it cannot be reached, or its `/v1/models` does not list M;
- what it reports contradicts the class revision in a correctness-tagged field (a dtype, KV dtype, window,
  RoPE scaling or weights other than the class declares: its tokens would differ from the class's). A
  performance field that differs (block size, memory) is shown as drift, as for any engine.
From then on the routing table lists it (node ADOPTED_NODE), so gateways route to it, subscribe to its KV
events and health-check it; `status` and the TUI show it; its class revision takes traffic like a deployed one
(the model's policy weights it, rollouts shift them).

fleetctl never starts, stops or restarts it. `fleetctl engine release NAME` drains it through the gateways:
its state becomes `draining`, so they send it no new request, and once it has drained for RELEASE_GRACE_S
(every gateway refreshed its table since) and its own counters show nothing running or waiting, it is
removed (`released`). The AdoptedEngines reconciler probes each one every PROBE_INTERVAL_S: `ready` while it
answers, `unreachable` while it does not (gateways route only to ready engines), and carries out releases.
The decisions are pure functions of the probes (`next_state`, `releasable`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from engine.contract import ReportedConfig
from engine.contract.reported import FLEET_CONFIG_PATH, served_model_ids, vllm_reported
from engine.contract.scrape import parse_engine_metrics
from fleetctl.controller.drift import engine_drift_of
from fleetctl.controller.models import AdoptedEngine, ClassRevision, Engine
from fleetctl.errors import Conflict, NotFound, ValidationFailed
from fleetctl.replica_class import ReplicaClassSpec, correctness_fields

ADOPTED_NODE = "adopted"  # the node adopted engines are listed on: they run on no agent's node
READY, UNREACHABLE, DRAINING = "ready", "unreachable", "draining"
PROBE_TIMEOUT_S = 3.0
PROBE_INTERVAL_S = 5.0
RELEASE_GRACE_S = 10.0  # at least three of a gateway's default 2 s table refreshes, with room to spare
ERROR_CHARS = 300


@dataclass(frozen=True)
class EngineProbe:
    """What an engine answered; `error` says why it could not be asked (then nothing else is known)."""

    models: tuple[str, ...] = ()
    reported: ReportedConfig | None = None
    metrics: dict[str, Any] | None = None
    error: str | None = None

    @property
    def busy(self) -> bool:
        """Requests running or waiting on it, by its own counters (unknown: treated as busy)."""
        if self.metrics is None:
            return True
        return self.metrics.get("num_requests_running", 0) + self.metrics.get("num_requests_waiting", 0) > 0


def probe_engine(http: httpx.Client, url: str, backend: str) -> EngineProbe:
    """Ask the engine at `url` what it serves, what it runs and how busy it is."""
    try:
        models = _get(http, url + "/v1/models").json()
        metrics_text = _get(http, url + "/metrics").text
        if backend == "vllm":
            version = _json_or_none(http, url + "/version")
            reported = vllm_reported(version, metrics_text, models)
        else:
            reported = ReportedConfig.model_validate(_get(http, url + FLEET_CONFIG_PATH).json())
        return EngineProbe(tuple(served_model_ids(models)), reported, parse_engine_metrics(metrics_text).model_dump())
    except httpx.HTTPStatusError as exc:
        return EngineProbe(error=f"{exc.request.url} answered {exc.response.status_code}")
    except httpx.HTTPError as exc:
        return EngineProbe(error=f"cannot reach {url}: {type(exc).__name__}: {exc}"[:ERROR_CHARS])
    except (ValueError, ValidationError) as exc:
        return EngineProbe(error=f"{url} answered something that is not an engine's answer ({type(exc).__name__})")


def _get(http: httpx.Client, url: str) -> httpx.Response:
    response = http.get(url, timeout=PROBE_TIMEOUT_S)
    response.raise_for_status()
    return response


def _json_or_none(http: httpx.Client, url: str) -> Any:
    try:
        return _get(http, url).json()
    except (httpx.HTTPError, ValueError):
        return None


def refusal(spec: ReplicaClassSpec, model: str, probe: EngineProbe) -> tuple[str, str] | None:
    """(field, why) when the engine may not join as a `spec` engine serving `model`; None when it may."""
    if probe.error is not None:
        return "url", probe.error
    if model not in probe.models:
        return "model", f"the engine serves {list(probe.models)}, not {model!r}"
    correctness = set(correctness_fields())
    contradicting = [d for d in engine_drift_of(spec, probe.reported) if d.field in correctness]
    if contradicting:
        first = contradicting[0]
        others = f" (and {', '.join(d.field for d in contradicting[1:])})" if len(contradicting) > 1 else ""
        return first.field, (f"the engine runs {first.field}={first.actual!r} but the class declares "
                             f"{first.declared!r}{others}: its answers would not be the class's")
    return None


# --- the store -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Adoption:
    name: str
    url: str
    model: str
    class_ref: str
    role: str = "mixed"
    kv_events_endpoint: str | None = None


def default_name(url: str) -> str:
    """adopted-HOST-PORT, as a fleet name (lowercase letters, digits, '-')."""
    netloc = re.sub(r"^https?://", "", url).split("/", 1)[0].lower()
    return ("adopted-" + re.sub(r"[^a-z0-9]+", "-", netloc).strip("-"))[:63].rstrip("-")


def class_spec(session: Session, class_ref: str) -> ReplicaClassSpec:
    row = session.get(ClassRevision, class_ref)
    if row is None:  # a field of the request that names nothing: invalid, before any engine is asked
        raise ValidationFailed(f"no class revision {class_ref!r} (apply it first: fleetctl class apply)",
                               field="class_ref")
    return ReplicaClassSpec.model_validate(row.spec)


def check_name_free(session: Session, name: str) -> None:
    if session.get(AdoptedEngine, name) is not None:
        raise Conflict(f"engine {name!r} is already adopted (release it first)", field="name")
    if session.execute(select(Engine.name).where(Engine.name == name)).first() is not None:
        raise Conflict(f"an agent already runs an engine named {name!r}", field="name")


def adopt(session: Session, adoption: Adoption, spec: ReplicaClassSpec, probe: EngineProbe, now: datetime,
          actor: str) -> AdoptedEngine:
    """Register the engine, or raise ValidationFailed naming the field `refusal` found (nothing stored)."""
    if spec.model != adoption.model:
        raise ValidationFailed(f"class {adoption.class_ref} serves {spec.model!r}, not {adoption.model!r}",
                               field="model")
    refused = refusal(spec, adoption.model, probe)
    if refused is not None:
        raise ValidationFailed(f"not adopted: {refused[1]}", field=refused[0])
    row = AdoptedEngine(name=adoption.name, url=adoption.url, model=adoption.model, class_ref=adoption.class_ref,
                        role=adoption.role, kv_events_endpoint=adoption.kv_events_endpoint, state=READY,
                        metrics=probe.metrics or {}, reported=probe.reported.model_dump() if probe.reported else None,
                        adopted_at=now, adopted_by=actor, checked_at=now)
    session.add(row)
    session.flush()
    return row


def release(session: Session, name: str, now: datetime) -> bool:
    """Start draining `name` through the gateways; False when it already was."""
    row = get_adopted(session, name)
    if row.state == DRAINING:
        return False
    row.state, row.draining_since = DRAINING, now
    return True


def get_adopted(session: Session, name: str) -> AdoptedEngine:
    row = session.get(AdoptedEngine, name)
    if row is None:
        raise NotFound(f"no adopted engine {name!r}", field="name")
    return row


def adopted_engines(session: Session) -> list[AdoptedEngine]:
    return list(session.execute(select(AdoptedEngine).order_by(AdoptedEngine.name)).scalars())


# --- what a probe changes (pure) --------------------------------------------------------------------------------

def next_state(state: str, probe: EngineProbe) -> str:
    """A draining engine stays draining; otherwise ready while it answers, unreachable while it does not."""
    if state == DRAINING:
        return DRAINING
    return UNREACHABLE if probe.error is not None else READY


def releasable(state: str, draining_since: datetime | None, probe: EngineProbe, now: datetime) -> bool:
    """Released once the gateways have had RELEASE_GRACE_S to stop routing to it and nothing runs on it (or
    it stopped answering: nothing of ours can be running on an engine that is gone)."""
    if state != DRAINING or draining_since is None:
        return False
    if (now - draining_since).total_seconds() < RELEASE_GRACE_S:
        return False
    return probe.error is not None or not probe.busy


def probe_all(http: httpx.Client, rows: Sequence[tuple[str, str, str]]) -> dict[str, EngineProbe]:
    """(name, url, backend) -> its probe, one after another (each bounded by PROBE_TIMEOUT_S per request)."""
    return {name: probe_engine(http, url, backend) for name, url, backend in rows}
