"""Plain surroundings for the runbook runner: commands answered from a script, a clock moved by sleeping,
answers and decisions queued, and every shown line and audit event kept."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import typer

from fleetctl.cli.main import app
from fleetctl.runbook.load import load_text
from fleetctl.runbook.runner import AuditEvent, Completed, Options, Runner, RunResult, Surroundings

ROOT = typer.main.get_command(app)


@dataclass
class Scripted:
    """`execute` answers: command line (space-joined, without `fleetctl`) -> a function of the try number
    returning (rc, stdout object or text)."""

    answers: dict[str, Callable[[int], tuple[int, Any]]] = field(default_factory=dict)
    decisions: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    rollback: bool = True
    now: float = 0.0
    ran: list[list[str]] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)
    audited: list[AuditEvent] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)

    def execute(self, argv: list[str], _timeout_s: float) -> Completed:
        self.ran.append(argv)
        key = " ".join(argv[1:])
        tries = sum(1 for a in self.ran if " ".join(a[1:]) == key)
        rc, out = self.answers.get(key, lambda _n: (0, ""))(tries)
        if rc != 0:
            return Completed(rc, "", f"error: {out}\n")
        return Completed(0, out if isinstance(out, str) else json.dumps(out), "")

    def surroundings(self) -> Surroundings:
        def confirm(_phase: str, _text: str) -> Any:
            return self.decisions.pop(0) if self.decisions else "run"

        def answer(question: str, _choices: list[str] | None) -> str:
            self.asked.append(question)
            return self.replies.pop(0)

        def sleep(seconds: float) -> None:
            self.now += seconds

        return Surroundings(execute=self.execute, show=self.shown.append, confirm=confirm, answer=answer,
                            offer_rollback=lambda _why: self.rollback, audit=self.audited.append,
                            clock=lambda: self.now, sleep=sleep)

    def run(self, text: str, values: dict[str, str] | None = None, **options: Any) -> RunResult:
        runbook = load_text(text).runbook
        return Runner(runbook, values or {}, "r1", self.surroundings(), Options(**options)).run()


def outcomes(result: RunResult) -> list[tuple[str, int, str]]:
    return [(s.phase, s.step, s.outcome) for s in result.steps]
