"""`fleetctl controller serve|migrate`. The controller package is imported only here, and only when
one of these runs, so other commands start fast."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from fleetctl.cli.output import status
from fleetctl.errors import Unavailable, ValidationFailed

NAME = "controller"
app = typer.Typer(no_args_is_help=True, help="Run the controller, or migrate its database.")

DbUrlOption = Annotated[str | None, typer.Option("--db-url", help="SQLAlchemy URL [env FLEET_DB_URL; default SQLite in the state dir]", show_default=False)]
StateDirOption = Annotated[Path | None, typer.Option("--state-dir", help="state directory [env FLEET_STATE_DIR; default ~/.local/state/fleetctl]", show_default=False)]


def _settings(**overrides: Any) -> Any:
    from pydantic import ValidationError

    from fleetctl.controller.settings import ControllerSettings

    try:
        return ControllerSettings.from_env(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise ValidationFailed(f"setting {field}: {first['msg']}", field=field) from None


@app.command()
def serve(
    db_url: DbUrlOption = None,
    state_dir: StateDirOption = None,
    host: Annotated[str | None, typer.Option("--host", help="listen address [env FLEET_HOST; default 127.0.0.1]", show_default=False)] = None,
    port: Annotated[int | None, typer.Option("--port", help="listen port [env FLEET_PORT; default 8080]", show_default=False)] = None,
    heartbeat_interval: Annotated[float | None, typer.Option("--heartbeat-interval", help="seconds between agent heartbeats [default 5]", show_default=False)] = None,
    down_after: Annotated[float | None, typer.Option("--down-after", help="seconds without heartbeat before a node is down [default 3 x interval]", show_default=False)] = None,
    reconcile_interval: Annotated[float | None, typer.Option("--reconcile-interval", help="seconds between reconcile passes [default 2]", show_default=False)] = None,
    heartbeat_flush: Annotated[float | None, typer.Option("--heartbeat-flush", help="seconds between batched heartbeat writes; 0: one transaction per beat [default 0.25]", show_default=False)] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning, error")] = "info",
    access_log: Annotated[bool, typer.Option("--access-log", help="log every request")] = False,
) -> None:
    """Run the controller API (migrates the database first; creates the bootstrap admin token on first start)."""
    from fleetctl.controller.server import serve as run

    settings = _settings(db_url=db_url, state_dir=state_dir, host=host, port=port, heartbeat_interval_s=heartbeat_interval,
                         down_after_s=down_after, reconcile_interval_s=reconcile_interval,
                         heartbeat_flush_s=heartbeat_flush)
    run(settings, log_level=log_level.lower(), access_log=access_log)


@app.command()
def migrate(db_url: DbUrlOption = None, state_dir: StateDirOption = None) -> None:
    """Apply database migrations and exit."""
    from fleetctl.controller.server import migrate_only

    from sqlalchemy.exc import OperationalError

    settings = _settings(db_url=db_url, state_dir=state_dir)
    try:
        revision = migrate_only(settings)
    except OperationalError as exc:
        raise Unavailable(f"database unreachable: {type(exc.orig).__name__}") from None
    status(f"database schema at revision {revision}")
