"""Actions an operator takes from the TUI. Each is an `Action`: what it does in words, the exact equivalent
`fleetctl` command, and the call that does it through the typed async client. `request_action` shows the
confirmation (ui/widgets/confirm.py: the command, a reason field, OK / Cancel) and, confirmed, runs the call
in a worker, posting ActionDone back. A read-only app (--readonly, or a viewer token) refuses every action
and says why, without showing the confirmation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fleetctl.client import AsyncControllerClient


@dataclass(frozen=True)
class Action:
    title: str  # "Drain node node-1"
    command: str  # the exact fleetctl command, reason included as --reason '<reason>' (shown with <reason>)
    run: Callable[[AsyncControllerClient, str], Awaitable[Any]]  # (client, reason) -> the API's answer
    destructive: bool = True


def drain_node(name: str) -> Action: raise NotImplementedError
def cordon_node(name: str) -> Action: raise NotImplementedError
def uncordon_node(name: str) -> Action: raise NotImplementedError
def drain_engine(node: str, name: str) -> Action: raise NotImplementedError
def pause_rollout(model: str, rollout_id: int) -> Action: raise NotImplementedError
def resume_rollout(model: str, rollout_id: int) -> Action: raise NotImplementedError
def promote_rollout(model: str, rollout_id: int, full: bool = False) -> Action: raise NotImplementedError
def abort_rollout(model: str, rollout_id: int) -> Action: raise NotImplementedError
def set_weights(model: str, weights: dict[str, float]) -> Action: raise NotImplementedError


def request_action(app: Any, action: Action) -> None:
    """Confirm `action` (a modal over the current screen) and run it; refused when the app is read-only."""
    raise NotImplementedError
