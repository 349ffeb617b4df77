"""An engine's role and lifecycle state: the words agents report, the controller stores and the gateway routes on.

`ROLES` and `ENGINE_STATES` are the runtime tuples of the `Role` and `EngineState` literals (argument
choices, column checks). An engine in a `RUNNING_STATES` state has a live process; one in a
`FINISHED_STATES` state has none and will not get one back without a new start.
"""

from __future__ import annotations

from typing import Literal, get_args

Role = Literal["mixed", "prefill", "decode"]
EngineState = Literal["starting", "ready", "draining", "stopped", "failed"]

ROLES: tuple[str, ...] = get_args(Role)
ENGINE_STATES: tuple[str, ...] = get_args(EngineState)
RUNNING_STATES: frozenset[str] = frozenset({"starting", "ready"})
FINISHED_STATES: frozenset[str] = frozenset({"stopped", "failed"})
