"""Every resource the change stream carries, built from the store in one session: the dicts the API's read
routes answer (views.py, gateways.py, rollout_views.py, canary_views.py, drills.py, traffic.py, flags.py),
keyed as watch_contract.key_of says, plus the controller replica and the pulse.

    builder = WatchBuilder(settings, is_leader=lambda: runtime.is_leader)
    with store.session() as session:
        resources = builder.build(session, now)     # kind -> key -> value

`WatchBuilder` keeps what a build needs from the builds before it:
- the counters' readings, for the engines' rates and the pulse (watch_rates.py): an engine's reading is
  its reported metrics at its report time (`updated_at`), a gateway's its `served` counters at its
  `last_seen`; only the readings a window still needs are kept, and those of engines and gateways that are
  gone are forgotten;
- the views of finished rollouts, built once per version: a rollout that completed or aborted does not move
  (its `weights` and `ready` are those of when it was built);
- the canary streams' views, rebuilt only when a stream's row changed (its `updated_at`): a stream's
  verdict and evidence change only when the verdict reconciler folds probes into it.
Rollouts are the active ones and the FINISHED_ROLLOUTS latest finished; drills the active ones and the
FINISHED_DRILLS latest ended.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

import fleetctl
from engine.contract import RUNNING_STATES
from fleetctl.controller import canary_views, drills, flags, gateways, rollout_observations, views
from fleetctl.controller.canary_streams import DesignSettings
from fleetctl.controller.models import CanaryStream, Deployment, Rollout, TrafficPolicy
from fleetctl.controller.rollout.spec import RolloutSpec
from fleetctl.controller.rollout.state import RolloutState, ServedCounters
from fleetctl.controller.rollout_views import build_view
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.traffic import traffic_view
from fleetctl.controller.watch_contract import CONTROLLER_KEY, PULSE_KEY, key_of
from fleetctl.controller.watch_rates import (
    MIN_WINDOW_S,
    EngineCounters,
    EngineWindow,
    GatewayWindow,
    Reading,
    engine_rates,
    engine_window,
    gateway_window,
    pick_window,
    pulse,
)

FINISHED_ROLLOUTS = 20
FINISHED_DRILLS = 20
Resources = dict[str, dict[str, dict[str, Any]]]
ServedReading = Reading[Mapping[str, ServedCounters]]


class Readings:
    """Each source's recent readings (key -> oldest first), trimmed to what a window needs: the newest
    reading at least MIN_WINDOW_S older than the latest, and those after it."""

    def __init__(self) -> None:
        self._by_key: dict[str, deque[Reading[Any]]] = {}

    def add(self, key: str, reading: Reading[Any]) -> None:
        """Keep `reading` unless it is the one kept last (same report time)."""
        history = self._by_key.setdefault(key, deque())
        if history and history[-1].at == reading.at:
            return
        history.append(reading)
        while len(history) > 2 and (history[-1].at - history[1].at).total_seconds() >= MIN_WINDOW_S:
            history.popleft()

    def window(self, key: str) -> tuple[Reading[Any], Reading[Any]] | None:
        return pick_window(list(self._by_key.get(key, ())))

    def keep_only(self, keys: set[str]) -> None:
        for gone in set(self._by_key) - keys:
            del self._by_key[gone]


class WatchBuilder:
    def __init__(self, settings: ControllerSettings, is_leader: Callable[[], bool],
                 heard_since: datetime | None = None):
        self.settings = settings
        self.is_leader = is_leader
        self.heard_since = heard_since  # when the controller started (rollout_observations.routing_acknowledged)
        self.engine_readings = Readings()
        self.gateway_readings = Readings()
        self._finished: dict[int, tuple[int, dict[str, Any]]] = {}  # rollout id -> (version, view)
        self._canary: tuple[frozenset[tuple[str, Any]], dict[str, dict[str, Any]]] | None = None

    def build(self, session: Session, now: datetime) -> Resources:
        nodes = views.nodes(session, now)
        engines = views.engines(session, now)
        gateway_views = gateways.list_gateways(session, now)
        # the overrides in force: a flag at its default is not news (GET /api/v1/flags lists every flag)
        flag_views = {key: view for key, view in flags.list_flags(session, now).items() if view["overridden"]}
        engine_windows = self._engine_windows(engines)
        gateway_windows = self._gateway_windows(session, gateway_views)
        fleet_pulse = pulse(now, nodes, engines, engine_windows.values(), gateway_views, gateway_windows,
                            {name: flag["value"] for name, flag in flag_views.items()})
        return {
            "controller": {CONTROLLER_KEY: self.controller(now)},
            "pulse": {PULSE_KEY: fleet_pulse.model_dump(mode="json")},
            "node": {n["name"]: n for n in nodes},
            "engine": {key_of("engine", e): {**e, "rates": engine_rates(engine_windows.get(key_of("engine", e)))
                                             .model_dump(mode="json")} for e in engines},
            "gateway": {g["name"]: g for g in gateway_views},
            "rollout": self.rollouts(session, now),
            "canary_stream": self.canary_streams(session),
            "drill": {str(d.id): drills.drill_view(d, now) for d in drills.list_drills(session, FINISHED_DRILLS)},
            "traffic": traffic_views(session, now),
            "flag": dict(flag_views),
        }

    def controller(self, now: datetime) -> dict[str, Any]:
        replica = self.settings.replica_name or f"{self.settings.host}:{self.settings.port}"
        return {"replica": replica, "leader": self.is_leader(), "version": fleetctl.__version__, "at": now.isoformat()}

    # --- rates ---

    def _engine_windows(self, engines: list[dict[str, Any]]) -> dict[str, EngineWindow]:
        """key -> the window of each running engine that has one."""
        running = {}
        for engine in engines:
            if engine["state"] in RUNNING_STATES and engine["updated_at"] is not None:
                key = key_of("engine", engine)
                running[key] = engine
                at = datetime.fromisoformat(engine["updated_at"])
                self.engine_readings.add(key, Reading(at, EngineCounters.of(engine["metrics"])))
        self.engine_readings.keep_only(set(running))
        windows = {key: self.engine_readings.window(key) for key in running}
        return {key: engine_window(*pair) for key, pair in windows.items() if pair is not None}

    def _gateway_windows(self, session: Session, gateway_views: list[dict[str, Any]]) -> list[GatewayWindow]:
        """The window of each live gateway that reports counters and has one."""
        served = gateways.served_by_gateway(session)
        for view in gateway_views:
            if view["name"] in served:
                self.gateway_readings.add(view["name"], Reading(datetime.fromisoformat(view["last_seen"]),
                                                                served[view["name"]]))
        self.gateway_readings.keep_only(set(served))
        pairs = [self.gateway_readings.window(v["name"]) for v in gateway_views if not v["stale"]]
        return [gateway_window(*pair) for pair in pairs if pair is not None]

    # --- rollouts and canary streams ---

    def rollouts(self, session: Session, now: datetime) -> dict[str, dict[str, Any]]:
        active = list(session.execute(select(Rollout).where(Rollout.active_model.is_not(None)).order_by(Rollout.id)).scalars())
        finished = list(session.execute(select(Rollout).where(Rollout.active_model.is_(None))
                                        .order_by(Rollout.id.desc()).limit(FINISHED_ROLLOUTS)).scalars())
        acknowledged = rollout_observations.routing_acknowledged(session, now, self.heard_since) if active else True
        found = {str(row.id): self._rollout_view(session, row, now, acknowledged) for row in active}
        for row in finished:
            cached = self._finished.get(row.id)
            if cached is None or cached[0] != row.version:
                cached = (row.version, self._rollout_view(session, row, now, acknowledged))
            self._finished[row.id] = cached
            found[str(row.id)] = cached[1]
        for gone in set(self._finished) - {row.id for row in finished}:
            del self._finished[gone]
        return found

    @staticmethod
    def _rollout_view(session: Session, row: Rollout, now: datetime, acknowledged: bool) -> dict[str, Any]:
        """rollout_views.rollout_view, with the gateways' acknowledgement read once for every rollout."""
        observations = rollout_observations.observe(session, row.model, [row.from_ref, row.to_ref], now, acknowledged)
        view = build_view(row, RolloutSpec.model_validate(row.spec), RolloutState.from_json(row.state), observations, now)
        return view.model_dump(mode="json")

    def canary_streams(self, session: Session) -> dict[str, dict[str, Any]]:
        stamps = frozenset(session.execute(select(CanaryStream.key, CanaryStream.updated_at)).tuples())
        if self._canary is None or self._canary[0] != stamps:
            streams = canary_views.status(session, DesignSettings.of(self.settings), None)
            self._canary = (stamps, {key_of("canary_stream", s): s for s in streams})
        return self._canary[1]


def traffic_views(session: Session, now: datetime) -> dict[str, dict[str, Any]]:
    """Each model with a traffic policy or a deployment: what `GET /api/v1/traffic/{model}` answers."""
    with_policy = set(session.execute(select(TrafficPolicy.model)).scalars())
    deployed = set(session.execute(select(Deployment.model).where(Deployment.replicas > 0)).scalars())
    found = {}
    for model in sorted(with_policy | deployed):
        drill = drills.misroute_of(session, model)
        found[model] = {**traffic_view(session, model),
                        "drill": drills.drill_view(drill, now) if drill is not None else None}
    return found
