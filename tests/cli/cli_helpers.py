"""Helpers for CLI tests: run `fleetctl` (CliRunner) against a real controller on loopback."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from typer.testing import CliRunner, Result

from fleetctl.cli.main import app
from fleetctl.client import ControllerClient
from fleetctl.controller.server import ServerThread

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
