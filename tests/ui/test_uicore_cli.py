"""`fleetctl tui` from the command line: registered, and without a terminal one readable line and exit 2."""

from __future__ import annotations

import sys

from typer.testing import CliRunner

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.main import app


def test_tui_needs_a_terminal() -> None:
    result = CliRunner().invoke(app, ["--controller", "http://127.0.0.1:9", "tui", "--readonly"])
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr.strip() == "error: fleetctl tui needs a terminal (for scripts: fleetctl status -o json)"


def test_other_commands_do_not_load_textual() -> None:
    import subprocess

    code = "import sys, fleetctl.cli.main; print('textual' in sys.modules, 'ui.app' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
