"""Running a runbook: preconditions, steps, and (when a step fails or the operator stops) the rollback.

The runner decides; its surroundings act. `Surroundings` carries every effect as a callable (run a command,
show a line, ask the operator, record an audit event, read the clock, sleep), so the CLI hands in a
subprocess and a terminal, and a test hands in plain functions and a clock it moves by hand.

Outcomes of a step: ok, failed, skipped (the operator said skip), aborted (the operator said abort), stopped
(an `ask` answer other than its `continue_if`), dry_run. A failed or aborted step offers the rollback (with
--yes: runs it); a stopped one does not (the operator chose to leave things as they are). Of a run: completed, failed, aborted, stopped,
precondition_failed (nothing was changed, no rollback), dry_run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from fleetctl.runbook import compare, jsonpath, template
from fleetctl.runbook.model import Ask, Check, Run, Runbook, Say, step_kind

Decision = Literal["run", "skip", "abort"]


@dataclass(frozen=True)
class Completed:
    rc: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class AuditEvent:
    """One record for the audit log: the run's start and finish, and each step's outcome."""

    event: Literal["start", "step", "finish"]
    runbook: str
    run_id: str
    outcome: str  # start: "started"; step: the step's outcome; finish: the run's outcome
    phase: str | None = None
    step: int | None = None  # 1-based within its phase
    kind: str | None = None
    text: str | None = None  # what ran (the command with its variables filled) or what was said/asked
    detail: str | None = None  # why it failed, what a check saw


@dataclass
class Surroundings:
    execute: Callable[[list[str], float], Completed]  # argv starting with "fleetctl", timeout in seconds
    show: Callable[[str], None]
    confirm: Callable[[str, str], Decision]  # (phase, the step as shown) -> run / skip / abort
    answer: Callable[[str, list[str] | None], str]  # (question, choices) -> the operator's answer
    offer_rollback: Callable[[str], bool]  # (why) -> run the rollback?
    audit: Callable[[AuditEvent], None]
    clock: Callable[[], float]
    sleep: Callable[[float], None]


@dataclass(frozen=True)
class StepResult:
    phase: str
    step: int  # 1-based within its phase
    kind: str
    text: str
    outcome: str
    detail: str = ""
    attempts: int = 0
    on_fail: str | None = None


@dataclass
class RunResult:
    runbook: str
    run_id: str
    outcome: str = "completed"
    vars: dict[str, str] = field(default_factory=dict)
    steps: list[StepResult] = field(default_factory=list)
    next_action: str | None = None  # after a failure: what the operator should do now
    rollback: str = "not_needed"  # not_needed | completed | failed | declined | none_defined

    def plain(self) -> dict[str, Any]:
        return {"runbook": self.runbook, "run_id": self.run_id, "outcome": self.outcome, "vars": self.vars,
                "next_action": self.next_action, "rollback": self.rollback,
                "steps": [vars(s) for s in self.steps]}


@dataclass(frozen=True)
class Options:
    interactive: bool = True  # False (--yes): no confirmations, the rollback runs on failure
    dry_run: bool = False  # show each step with its variables filled; run nothing
    rollback: bool = True  # False (--no-rollback): never offer or run it


STOPPING = ("failed", "aborted", "stopped")
DEFAULT_NEXT = ("the runbook stopped at {where}: fix what it reports and run the runbook again, "
                "or finish the remaining steps by hand")


class Runner:
    def __init__(self, runbook: Runbook, values: dict[str, str], run_id: str, io: Surroundings, options: Options):
        self.runbook, self.io, self.options = runbook, io, options
        self.values = {**values, "runbook": runbook.id, "run_id": run_id}
        self.result = RunResult(runbook.id, run_id, vars=dict(values))

    def run(self) -> RunResult:
        self._audit("start", "started")
        stopped = self._phase("preconditions", self.runbook.preconditions)
        if stopped is not None:
            self._stop(stopped, "precondition_failed" if stopped.outcome == "failed" else stopped.outcome,
                       "the fleet is not in the state this runbook is for; nothing was changed")
        else:
            stopped = self._phase("steps", self.runbook.steps)
            if stopped is not None:
                self._stop(stopped, stopped.outcome, None)
                if stopped.outcome != "stopped":  # an answer that stops the run leaves things as the operator chose
                    self._maybe_roll_back(stopped)
        if self.options.dry_run:
            self._phase("rollback", self.runbook.rollback)
            self.result.outcome = "dry_run"
        self.result.vars = {k: v for k, v in self.values.items() if k not in ("runbook", "run_id")}
        self._audit("finish", self.result.outcome, detail=self.result.next_action)
        return self.result

    # --- phases ---

    def _phase(self, phase: str, steps: list[Any]) -> StepResult | None:
        """Run `steps` in order; the first that stops the run, or None."""
        for index, step in enumerate(steps, start=1):
            result = self._one(phase, index, len(steps), step)
            self.result.steps.append(result)
            self._audit("step", result.outcome, result)
            if result.outcome in STOPPING:
                return result
        return None

    def _stop(self, at: StepResult, outcome: str, default_next: str | None) -> None:
        self.result.outcome = outcome
        where = f"{at.phase} step {at.step} ({at.kind})"
        self.result.next_action = at.on_fail or default_next or DEFAULT_NEXT.format(where=where)
        self.io.show(f"stopped at {where}: {at.detail or at.outcome}")
        self.io.show(f"next: {self.result.next_action}")

    def _maybe_roll_back(self, at: StepResult) -> None:
        if not self.runbook.rollback:
            self.result.rollback = "none_defined"
            return
        if not self.options.rollback:
            self.result.rollback = "declined"
            return
        why = f"{at.phase} step {at.step} {at.outcome}"
        if self.options.interactive and not self.io.offer_rollback(why):
            self.result.rollback = "declined"
            return
        self.io.show(f"rolling back ({len(self.runbook.rollback)} steps)")
        results = [self._rollback_step(i, step) for i, step in enumerate(self.runbook.rollback, start=1)]
        self.result.rollback = "failed" if any(r.outcome in STOPPING for r in results) else "completed"

    def _rollback_step(self, index: int, step: Any) -> StepResult:
        """A rollback goes on past a failed step: each later one may still undo something."""
        result = self._one("rollback", index, len(self.runbook.rollback), step)
        self.result.steps.append(result)
        self._audit("step", result.outcome, result)
        return result

    # --- one step ---

    def _one(self, phase: str, index: int, total: int, step: Any) -> StepResult:
        kind = step_kind(step) or "?"
        base = StepResult(phase, index, kind, self._text(step), "ok", on_fail=self._fill_text(getattr(step, "on_fail", None)))
        if self.options.dry_run:  # the plan is the result: nothing to narrate
            return replace(base, outcome="dry_run")
        self.io.show(f"[{phase} {index}/{total}] {kind}: {base.text}")
        if isinstance(step, Say):
            return base
        if isinstance(step, Ask):
            return self._ask(step, base)
        if self.options.interactive:
            decision = self.io.confirm(phase, base.text)
            if decision != "run":
                return replace(base, outcome="skipped" if decision == "skip" else "aborted",
                               detail="the operator said " + decision)
        return self._run(step, base) if isinstance(step, Run) else self._check(step, base)

    def _text(self, step: Any) -> str:
        if isinstance(step, (Run, Check)):
            words = template.fill_words(step.run if isinstance(step, Run) else step.check, self.values, keep_unknown=True)
            shown = template.shown(words)
            if isinstance(step, Check):
                where = self._fill_text(step.path) or "(the output)"
                wanted = self._fill_text(step.expect_path) if step.expect_path is not None \
                    else compare.shown(self._expected(step))
                shown += f" -o json: {where} {compare.DESCRIPTION[step.op]} {wanted}"
            return shown
        return self._fill_text(step.say if isinstance(step, Say) else step.ask) or ""

    def _fill_text(self, text: str | None) -> str | None:
        return None if text is None else template.fill(text, self.values, keep_unknown=True)

    def _expected(self, step: Check) -> Any:
        return self._fill_text(step.expect) if isinstance(step.expect, str) else step.expect

    def _run(self, step: Run, base: StepResult) -> StepResult:
        done = self.io.execute(template.fill_words(step.run, self.values), step.timeout_s)
        if done.rc == 0:
            return replace(base, attempts=1)
        return replace(base, outcome="failed", attempts=1, detail=f"exit {done.rc}: {last_line(done.stderr)}")

    def _check(self, step: Check, base: StepResult) -> StepResult:
        argv = [*template.fill_words(step.check, self.values), "-o", "json"]
        expected = self._expected(step)
        deadline = self.io.clock() + step.timeout_s
        attempts = 0
        while True:
            attempts += 1
            passed, seen = self._look(argv, step, expected)
            if passed:
                return replace(base, attempts=attempts, detail=seen)
            left = deadline - self.io.clock()
            if left <= 0:
                waited = f" after {step.timeout_s:g}s ({attempts} tries)" if step.timeout_s else ""
                return replace(base, outcome="failed", attempts=attempts, detail=f"{seen}{waited}")
            self.io.show(f"  {seen}; again in {min(step.interval_s, left):g}s")
            self.io.sleep(min(step.interval_s, left))

    def _look(self, argv: list[str], step: Check, expected: Any) -> tuple[bool, str]:
        """(holds, what was seen) for one try of a check."""
        done = self.io.execute(argv, max(step.interval_s, 30.0))
        if done.rc != 0:
            return False, f"the command failed (exit {done.rc}): {last_line(done.stderr)}"
        try:
            document = json.loads(done.stdout)
            actual = jsonpath.pick(document, template.fill(step.path, self.values))
            if step.expect_path is not None:
                expected = jsonpath.pick(document, template.fill(step.expect_path, self.values))
        except ValueError:
            return False, "the command's output is not JSON"
        except jsonpath.PathMissing as exc:
            return False, str(exc)
        where = template.fill(step.path, self.values) or "(the output)"
        return compare.holds(step.op, actual, expected), f"{where}: {compare.describe(step.op, actual, expected)}"

    def _ask(self, step: Ask, base: StepResult) -> StepResult:
        given = self.values.get(step.var)
        answer = given if given is not None else self.io.answer(base.text, step.choices)
        self.values[step.var] = answer
        if step.choices and answer not in step.choices:
            return replace(base, outcome="failed", detail=f"answer {answer!r} is not one of {step.choices}")
        if step.continue_if is not None and answer != step.continue_if:
            return replace(base, outcome="stopped", detail=f"answered {answer!r}")
        return replace(base, detail=f"{step.var} = {answer}")

    def _audit(self, event: Literal["start", "step", "finish"], outcome: str, step: StepResult | None = None,
               detail: str | None = None) -> None:
        if self.options.dry_run:
            return
        if step is None:
            self.io.audit(AuditEvent(event, self.runbook.id, self.result.run_id, outcome, detail=detail))
            return
        self.io.audit(AuditEvent(event, self.runbook.id, self.result.run_id, outcome, step.phase, step.step, step.kind,
                                 step.text, step.detail or None))


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"
