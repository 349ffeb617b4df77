"""Where runbooks are found: `docs/runbooks/` of the source tree this package runs from (the runbooks are
docs an operator reads as well as procedures `fleetctl runbook` runs), or FLEET_RUNBOOK_DIR when set.
`fleetctl runbook run ID` looks ID up there; a path to a YAML file works anywhere."""

from __future__ import annotations

import os
from pathlib import Path

from fleetctl.runbook.errors import RunbookNotFound

ENV = "FLEET_RUNBOOK_DIR"
SOURCE_DIR = Path(__file__).resolve().parents[2] / "docs" / "runbooks"


def runbook_dir() -> Path:
    return Path(os.environ[ENV]) if os.environ.get(ENV) else SOURCE_DIR


def shipped() -> list[Path]:
    """Every runbook file in the runbook directory, by name."""
    folder = runbook_dir()
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


def locate(name: str) -> Path:
    """The file of runbook NAME (an id in the runbook directory, or a path to a YAML file)."""
    if name.endswith((".yaml", ".yml")) or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise RunbookNotFound(f"no runbook file {name}")
        return path
    path = runbook_dir() / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(p.stem for p in shipped()) or f"none: set {ENV}"
        raise RunbookNotFound(f"no runbook {name!r} in {runbook_dir()} (runbooks: {known})")
    return path
