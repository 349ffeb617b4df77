"""The audit records of runbook runs (`fleetctl runbook run`): the body the CLI sends for a run's start, each
step's outcome and the run's finish, and what the controller answers. Plain models: the client imports them.

The audit event's action is `runbook.start|step|finish`, its target the runbook (and the step), its result
ok / noop (skipped) / error (failed, aborted, stopped), its code the outcome word, its detail the rest.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from engine.contract.bounds import FreeText, SafeStr
from fleetctl.controller.responses import ResponseModel
from fleetctl.controller.schemas import Body, Name

Outcome = Literal["started", "ok", "failed", "skipped", "aborted", "stopped", "completed", "precondition_failed"]
OK_OUTCOMES = frozenset({"started", "ok", "completed"})


class RunbookEvent(Body):
    runbook: Name = Field(description="the runbook's id")
    run_id: Annotated[SafeStr, Field(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_-]+$")] = Field(
        description="the run (every event of one run has the same)")
    event: Literal["start", "step", "finish"]
    outcome: Outcome = Field(description="start: started; a step's outcome; the run's outcome")
    phase: Literal["preconditions", "steps", "rollback"] | None = None
    step: Annotated[int, Field(ge=1, le=10_000)] | None = Field(default=None, description="1-based within its phase")
    kind: Literal["say", "run", "check", "ask"] | None = None
    text: FreeText | None = Field(default=None, description="the command as run (variables filled), or the text")
    detail: FreeText | None = Field(default=None, description="why it failed, what a check saw")


class RunbookEventRecorded(ResponseModel):
    action: str = Field(description="runbook.start | runbook.step | runbook.finish")
    target: str = Field(description="the runbook, and the step (`node-maintenance steps.3`)")
    result: Literal["ok", "noop", "error"] = Field(description="ok, noop (skipped) or error (failed, aborted, stopped)")


def audit_result(outcome: str) -> Literal["ok", "noop", "error"]:
    return "ok" if outcome in OK_OUTCOMES else "noop" if outcome == "skipped" else "error"


def audit_target(event: RunbookEvent) -> str:
    return f"{event.runbook} {event.phase}.{event.step}" if event.step is not None else event.runbook
