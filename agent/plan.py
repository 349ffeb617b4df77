"""The agent's reconcile diff: a pure function from (desired, observed) to the actions that close the gap.

Level-based, as controller-runtime reconcilers are: it never asks what changed, only how the world differs
from the wish, so running it twice on the same snapshot gives the same actions, and an action that is already
under way yields nothing new (a starting engine is not started again, a draining one is not drained again).

| desired                         | observed                         | action  |
|---------------------------------|----------------------------------|---------|
| runs (drain=false)              | absent or stopped                | start   |
| runs                            | other class_ref or role          | restart |
| runs                            | runs with another planted fault  | restart |
| runs                            | failed (crashed, start failed)   | restart |
| runs                            | starting, ready                  | -       |
| runs                            | draining                         | - (it exits, then is started again) |
| drain=true                      | starting, ready                  | drain   |
| drain=true                      | draining, stopped, failed, absent| -       |
| absent                          | starting, ready, failed          | stop    |
| absent                          | draining, stopped                | -       |

The planted fault a process runs with (a canary drill's, EngineAssignment.planted_fault) is not in what the
agent reports (EngineObserved leaves it out on purpose), so the supervisor passes it in as `faults`.

Restart timing (backoff after a crash) is the supervisor's gate, not part of the diff: a failed engine keeps
yielding `restart` until the supervisor decides the backoff has passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from engine.contract import RUNNING_STATES, EngineAssignment, EngineObserved

ActionKind = Literal["start", "stop", "restart", "drain"]


@dataclass(frozen=True)
class Action:
    """One step for the supervisor. `assignment` is what to run for start/restart; None for stop/drain."""

    kind: ActionKind
    name: str
    assignment: EngineAssignment | None = None


def plan_actions(desired: Sequence[EngineAssignment], observed: Sequence[EngineObserved],
                 faults: Mapping[str, str | None] | None = None) -> list[Action]:
    """The actions that make `observed` match `desired`, in a stable order (desired first, then strays).
    `faults`: engine name -> the planted fault its process runs with (absent: none)."""
    seen = {engine.name: engine for engine in observed}
    wanted = {assignment.name for assignment in desired}
    running = faults or {}
    actions = [a for d in desired if (a := _for_desired(d, seen.get(d.name), running.get(d.name))) is not None]
    actions += [Action("stop", o.name) for o in observed if o.name not in wanted and _should_stop(o)]
    return actions


def _for_desired(desired: EngineAssignment, observed: EngineObserved | None, fault: str | None) -> Action | None:
    if desired.drain:
        if observed is not None and observed.state in RUNNING_STATES:
            return Action("drain", desired.name)
        return None
    if observed is None or observed.state == "stopped":
        return Action("start", desired.name, desired)
    if observed.state == "draining":
        return None
    if observed.state == "failed" or _differs(desired, observed, fault):
        return Action("restart", desired.name, desired)
    return None


def _differs(desired: EngineAssignment, observed: EngineObserved, fault: str | None) -> bool:
    """Class revisions are immutable, so class_ref and role say everything about what a process serves,
    but for a planted fault, which only the process's environment holds."""
    return desired.class_ref != observed.class_ref or desired.role != observed.role or desired.planted_fault != fault


def _should_stop(observed: EngineObserved) -> bool:
    return observed.state in RUNNING_STATES or observed.state == "failed"
