"""The real thing in processes: `fleetctl controller serve` as a subprocess on loopback (SQLite in a state
dir, or PostgreSQL via FLEET_DB_URL), the bootstrap token file, and the CLI finding that token by itself."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.controller.server import free_port
from fleetctl.controller.testing import PG_URL_ENV, pg_test_schema, wait_healthy

REPO = Path(__file__).resolve().parents[2]


def fleetctl(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetctl.cli.main", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def base_env(state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update({"FLEET_STATE_DIR": str(state_dir), "PYTHONPATH": str(REPO)})
    return env


@pytest.fixture(params=["sqlite", "postgresql"])
def db_env(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    if request.param == "sqlite":
        yield {}
        return
    if not os.environ.get(PG_URL_ENV):
        pytest.skip(f"PostgreSQL tests need {PG_URL_ENV}")
    with pg_test_schema(os.environ[PG_URL_ENV]) as url:
        yield {"FLEET_DB_URL": url}


def test_serve_bootstrap_token_and_local_cli(tmp_path: Path, db_env: dict[str, str]) -> None:
    state = tmp_path / "state"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**base_env(state), **db_env}
    server = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "controller", "serve", "--port", str(port)],
                              env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(url, server)
        token_file = state / "bootstrap-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        cli_env = {**env, "FLEET_CONTROLLER": url}
        status = fleetctl("status", "-o", "json", env=cli_env)  # no --token: the local bootstrap token is used
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["controller"]["leader"] is True
        denied = fleetctl("--token", "fleet_wrong", "status", env=cli_env)
        assert denied.returncode == ExitCode.AUTH
        assert denied.stderr.strip().splitlines() == [
            "error: unknown or revoked token (pass --token or set FLEET_TOKEN)"]
    finally:
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=30)
    assert server.returncode == 0, stderr
    assert token_file.read_text().strip() not in stderr  # the token is never logged


def test_migrate_command(tmp_path: Path, db_env: dict[str, str]) -> None:
    from alembic.script import ScriptDirectory

    from fleetctl.controller.db import alembic_config

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    env = {**base_env(tmp_path), **db_env}
    for _ in range(2):
        result = fleetctl("controller", "migrate", env=env)
        assert result.returncode == 0, result.stderr
        assert f"database schema at revision {head}" in result.stderr


def test_migrate_against_an_unreachable_database(tmp_path: Path) -> None:
    env = {**base_env(tmp_path), "FLEET_DB_URL": f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/none?connect_timeout=2"}
    result = fleetctl("controller", "migrate", env=env)
    assert result.returncode == ExitCode.UNAVAILABLE
    assert result.stderr.strip().splitlines() == ["error: database unreachable: OperationalError"]


def test_bad_setting_is_one_line(tmp_path: Path) -> None:
    result = fleetctl("controller", "serve", env={**base_env(tmp_path), "FLEET_PORT": "eighty"})
    assert result.returncode == ExitCode.USAGE
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: setting port:")
