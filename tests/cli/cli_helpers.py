"""Helpers for CLI tests: run `fleetctl` (CliRunner) against a real controller on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from fleetctl.cli.main import app
from fleetctl.client import ControllerClient
from fleetctl.controller.server import ServerThread
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import PG_URL_ENV, migrated_sqlite, pg_test_schema, role_tokens

CLASS_YAML = """\
name: chat
spec:
  model: smollm2-135m
  weights: smollm2
  dtype: {dtype}
  max_num_seqs: {seqs}
"""


@dataclass
class Fleet:
    server: ServerThread
    tokens: dict[str, str]

    def run(self, *args: str, role: str | None = "admin", input: str | None = None, env: dict[str, str] | None = None) -> Result:
        token = ["--token", self.tokens[role]] if role else []
        return CliRunner().invoke(app, ["--controller", self.server.url, *token, *args], input=input, env=env)

    def client(self, role: str = "admin") -> ControllerClient:
        return ControllerClient(self.server.url, self.tokens[role])


def one_error_line(result: Result, after_progress: bool = False) -> str:
    """The single error line of a failed command on stderr (the last line, after any progress lines when
    `after_progress`), and no traceback anywhere."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if after_progress:
        assert [line for line in lines if line.startswith("error")] == lines[-1:], result.stderr
        lines = lines[-1:]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return lines[0]


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
    return result


def class_file(tmp_path: Any, dtype: str = "float32", seqs: int = 64) -> str:
    path = tmp_path / f"chat-{dtype}-{seqs}.yaml"
    path.write_text(CLASS_YAML.format(dtype=dtype, seqs=seqs))
    return str(path)


def controller_fleet(backend: str, tmp_path: Path) -> Iterator[Fleet]:
    """The `fleet` fixture's body: a controller on `backend` (sqlite, or postgresql when FLEET_TEST_PG_URL
    is set; skipped otherwise) for one test, with a token per role."""
    if backend == "sqlite":
        yield from _serve(migrated_sqlite(tmp_path / "fleet.db"), tmp_path)
        return
    if not os.environ.get(PG_URL_ENV):
        pytest.skip(f"PostgreSQL tests need {PG_URL_ENV}")
    with pg_test_schema(os.environ[PG_URL_ENV], migrated=True) as url:
        yield from _serve(url, tmp_path)


def _serve(db_url: str, tmp_path: Path) -> Iterator[Fleet]:
    # Nodes registered by a test send no heartbeats: a generous down-after keeps them up for the whole test,
    # however slowly the machine runs the CLI processes between registration and reconcile.
    settings = ControllerSettings(db_url=db_url, state_dir=tmp_path / "state", port=0,
                                  heartbeat_interval_s=0.2, down_after_s=60, reconcile_interval_s=0.1)
    with ServerThread(settings) as server:
        yield Fleet(server, role_tokens(server.runtime.store))
