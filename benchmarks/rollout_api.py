"""The controller calls the rollout benchmark makes: the typed client for classes, rollouts by their routes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fleetctl.client import ControllerClient


class RolloutApi:
    def __init__(self, controller_url: str, token: str):
        self.client = ControllerClient(controller_url, token=token, timeout=30.0)

    def start(self, spec: dict[str, Any], reason: str) -> int:
        return self.client.start_rollout(spec, reason=reason).id

    def view(self, rollout_id: int) -> dict[str, Any]:
        return self.client.get_rollout(rollout_id).model_dump(mode="json")

    def abort(self, rollout_id: int, reason: str) -> None:
        self.client.rollout_command(rollout_id, "abort", reason=reason)

    def wait(self, rollout_id: int, done: Callable[[dict[str, Any]], bool], timeout_s: float,
             every_s: float = 0.2) -> dict[str, Any]:
        """Poll the rollout until `done(view)`; the last view on timeout (the caller reads its phase)."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.view(rollout_id)
            if done(view) or time.monotonic() >= deadline:
                return view
            time.sleep(every_s)
