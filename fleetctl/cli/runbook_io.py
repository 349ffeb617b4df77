"""What `fleetctl runbook run` hands the runner (fleetctl/runbook/runner.py): each step's command as a
`fleetctl` subprocess, the operator's terminal, and the audit log, with a local file when the controller
cannot be reached.

A step's command runs as `python -m fleetctl.cli.main --controller URL --request-timeout S ...`, the token in
its environment (FLEET_TOKEN, never on a command line other users can read): the same controller and token
as the runbook command itself. Its stderr (progress and errors) is shown live, indented; its stdout after it
ends (for a check: not at all, the runner reads it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import typer

from fleetctl.cli.context import CliContext, local_token
from fleetctl.cli.output import status
from fleetctl.controller.paths import default_state_dir
from fleetctl.errors import Unavailable
from fleetctl.runbook.runner import AuditEvent, Completed, Decision

FALLBACK_FILE = "runbook-audit.jsonl"
KILLED_RC = 124


class Executor:
    """Runs a step's `fleetctl ...` words as a subprocess against the runbook command's controller."""

    def __init__(self, cli: CliContext, echo_stdout: bool = True):
        self.cli, self.echo_stdout = cli, echo_stdout

    def argv(self, words: list[str]) -> list[str]:
        return [sys.executable, "-m", "fleetctl.cli.main", "--controller", self.cli.controller,
                "--request-timeout", f"{self.cli.timeout_s:g}", *words[1:]]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        token = self.cli.token or local_token()
        if token:
            env["FLEET_TOKEN"] = token
        return env

    def __call__(self, words: list[str], timeout_s: float) -> Completed:
        is_check = words[-2:] == ["-o", "json"]
        process = subprocess.Popen(self.argv(words), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=self.env(), stdin=subprocess.DEVNULL)
        errors: list[str] = []
        output: list[str] = []
        readers = [threading.Thread(target=_tee, args=(process.stderr, errors, not is_check), daemon=True),
                   threading.Thread(target=_tee, args=(process.stdout, output, False), daemon=True)]
        for reader in readers:
            reader.start()
        try:
            rc = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            rc = KILLED_RC
            errors.append(f"error: killed after {timeout_s:g}s\n")
        for reader in readers:
            reader.join(timeout=5)
        stdout = "".join(output)
        if self.echo_stdout and not is_check and stdout.strip():
            for line in stdout.rstrip().splitlines():
                status(f"  | {line}")
        return Completed(rc, stdout, "".join(errors))


def _tee(stream: Any, into: list[str], show: bool) -> None:
    for line in stream:
        into.append(line)
        if show:
            status(f"  | {line.rstrip()}")


class Terminal:
    """The operator, at a terminal: prompts go to stderr, so `-o json` keeps stdout for data."""

    @staticmethod
    def confirm(phase: str, text: str) -> Decision:
        while True:
            reply = typer.prompt("  run it? [y]es, [s]kip, [a]bort", default="y", err=True).strip().lower()
            if reply in ("y", "yes"):
                return "run"
            if reply in ("s", "skip"):
                return "skip"
            if reply in ("a", "abort", "n", "no"):
                return "abort"

    @staticmethod
    def answer(question: str, choices: list[str] | None) -> str:
        hint = f" [{'/'.join(choices)}]" if choices else ""
        while True:
            reply = typer.prompt(f"  {question}{hint}", err=True).strip()
            if reply and (not choices or reply in choices):
                return reply

    @staticmethod
    def offer_rollback(why: str) -> bool:
        return typer.confirm(f"{why}: run the rollback steps?", default=True, err=True)


class AuditSink:
    """Sends each runbook event to the controller's audit log; while the controller cannot be reached (the
    control plane is down: a runbook for that must still run), appends it to FLEET_STATE_DIR/runbook-audit.jsonl
    instead, and says so once."""

    def __init__(self, cli: CliContext, fallback: Path | None = None):
        self.cli = cli
        self.fallback = fallback or default_state_dir() / FALLBACK_FILE
        self.warned = False

    def __call__(self, event: AuditEvent) -> None:
        body = {k: v for k, v in asdict(event).items() if v is not None}
        try:
            self.cli.client().record_runbook(body)
        except Unavailable as exc:
            self._local(body, exc.message)

    def _local(self, body: dict[str, Any], why: str) -> None:
        if not self.warned:
            status(f"warning: the controller cannot record this run ({why}); recording it in {self.fallback}")
            self.warned = True
        line = {"at": datetime.now(timezone.utc).isoformat(), "controller": self.cli.controller, **body}
        self.fallback.parent.mkdir(parents=True, exist_ok=True)
        with self.fallback.open("a") as out:
            out.write(json.dumps(line) + "\n")
