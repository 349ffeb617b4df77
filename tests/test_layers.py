"""The layers of DESIGN.md hold: import-linter's contracts (pyproject.toml, [tool.importlinter]) are kept, and
importing a process's entry module loads neither torch nor textual (checked in a fresh interpreter, because
a lazy import that runs at import time is invisible to a static check)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
HEAVY = ("torch", "textual")
ENTRY_MODULES = {
    "fleetctl.controller.server": HEAVY + ("typer", "fleetctl.gateway"),
    "fleetctl.gateway.server": HEAVY,
    "fleetctl.gateway.app": HEAVY,
    "fleetctl.cli.main": HEAVY,
    "agent.runtime": HEAVY + ("fleetctl",),
}


def repo_env() -> dict[str, str]:
    """The environment with this checkout first on the path, so the checkout is what gets analysed."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


def test_import_contracts_are_kept() -> None:
    assert LINT_IMPORTS.exists(), f"import-linter is not installed next to {sys.executable}"
    done = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=REPO_ROOT, env=repo_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(("module", "forbidden"), ENTRY_MODULES.items(), ids=list(ENTRY_MODULES))
def test_an_entry_module_loads_no_heavy_or_foreign_package(module: str, forbidden: tuple[str, ...]) -> None:
    probe = (f"import sys, {module}; "
             f"print(' '.join(m for m in sys.modules if m.split('.')[0] in {forbidden!r} or m in {forbidden!r}))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, env=repo_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"importing {module} loads {done.stdout.split()}"
