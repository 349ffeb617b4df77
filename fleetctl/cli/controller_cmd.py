"""`fleetctl controller serve|migrate`. Their options are ControllerSettings' fields
(fleetctl/cli/settings_options.py): help and defaults come from the settings class, and an option not given
leaves the environment's value or the field's default (`ControllerSettings.from_env`). Of the controller
package only its settings module loads with the CLI; the server is imported when one of these runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from engine.process_settings import settings_problem
from fleetctl.cli.output import status
from fleetctl.cli.settings_options import OptionMap, setting_option
from fleetctl.controller.settings import ENV_VARS, ControllerSettings
from fleetctl.errors import Unavailable, ValidationFailed

NAME = "controller"
app = typer.Typer(no_args_is_help=True, help="Run the controller, or migrate its database.")

def _opt(field: str, *flags: str) -> Any:
    env = f"; env {ENV_VARS[field]}" if field in ENV_VARS else ""
    return setting_option(ControllerSettings, field, *flags, help_suffix=env)


DbUrlOption = Annotated[str | None, _opt("db_url", "--db-url")]
StateDirOption = Annotated[Path | None, _opt("state_dir", "--state-dir")]

SERVE_OPTIONS = OptionMap(
    settings=ControllerSettings,
    renamed={"heartbeat_interval": "heartbeat_interval_s", "down_after": "down_after_s",
             "reconcile_interval": "reconcile_interval_s", "heartbeat_flush": "heartbeat_flush_s"},
    not_settings={"log_level": "how much the process logs, not how the controller behaves",
                  "access_log": "how much the process logs, not how the controller behaves"},
    not_options={
        "bootstrap_token": f"a secret, read from env {ENV_VARS['bootstrap_token']} only (a flag would show it in "
        "the process list)",
        "canary_probe_api_key": f"a secret, read from env {ENV_VARS['canary_probe_api_key']} only (a flag would "
        "show it in the process list)",
        "background": "off only where tests build the API without its reconcile loop; a served controller runs it",
    },
)


def _settings(**options: Any) -> Any:
    try:
        return ControllerSettings.from_env(**options)
    except ValidationError as exc:
        field, line = settings_problem(exc)
        raise ValidationFailed(f"setting {line}", field=field) from None


@app.command()
def serve(
    db_url: DbUrlOption = None,
    state_dir: StateDirOption = None,
    host: Annotated[str | None, _opt("host", "--host")] = None,
    port: Annotated[int | None, _opt("port", "--port")] = None,
    heartbeat_interval: Annotated[float | None, _opt("heartbeat_interval_s", "--heartbeat-interval")] = None,
    down_after: Annotated[float | None, _opt("down_after_s", "--down-after")] = None,
    reconcile_interval: Annotated[float | None, _opt("reconcile_interval_s", "--reconcile-interval")] = None,
    heartbeat_flush: Annotated[float | None, _opt("heartbeat_flush_s", "--heartbeat-flush")] = None,
    token_cache_s: Annotated[float | None, _opt("token_cache_s", "--token-cache-s")] = None,
    max_body_bytes: Annotated[int | None, _opt("max_body_bytes", "--max-body-bytes")] = None,
    migrate_on_start: Annotated[bool | None, _opt("migrate_on_start", "--migrate-on-start/--no-migrate-on-start")] = None,
    canary_budget_share: Annotated[float | None, _opt("canary_budget_share", "--canary-budget-share")] = None,
    canary_capacity_window_s: Annotated[float | None, _opt("canary_capacity_window_s", "--canary-capacity-window")] = None,
    canary_pinned_interval_s: Annotated[float | None, _opt("canary_pinned_interval_s", "--canary-pinned-interval")] = None,
    canary_production_interval_s: Annotated[
        float | None, _opt("canary_production_interval_s", "--canary-production-interval")] = None,
    canary_floor_interval_s: Annotated[float | None, _opt("canary_floor_interval_s", "--canary-floor-interval")] = None,
    canary_urgent_interval_s: Annotated[float | None, _opt("canary_urgent_interval_s", "--canary-urgent-interval")] = None,
    canary_production_share: Annotated[float | None, _opt("canary_production_share", "--canary-production-share")] = None,
    canary_urgent_share: Annotated[float | None, _opt("canary_urgent_share", "--canary-urgent-share")] = None,
    canary_false_alarm_days: Annotated[float | None, _opt("canary_false_alarm_days", "--canary-false-alarm-days")] = None,
    canary_shift: Annotated[float | None, _opt("canary_shift", "--canary-shift")] = None,
    canary_min_probes: Annotated[int | None, _opt("canary_min_probes", "--canary-min-probes")] = None,
    canary_recovery_probes: Annotated[int | None, _opt("canary_recovery_probes", "--canary-recovery-probes")] = None,
    canary_timeout_s: Annotated[float | None, _opt("canary_timeout_s", "--canary-timeout")] = None,
    canary_concurrency: Annotated[int | None, _opt("canary_concurrency", "--canary-concurrency")] = None,
    canary_batch_conditions: Annotated[str | None, _opt("canary_batch_conditions", "--canary-batch-conditions")] = None,
    canary_webhook_url: Annotated[str | None, _opt("canary_webhook_url", "--canary-webhook-url")] = None,
    canary_budget_window_s: Annotated[float | None, _opt("canary_budget_window_s", "--canary-budget-window")] = None,
    canary_probe_retention_s: Annotated[
        float | None, _opt("canary_probe_retention_s", "--canary-probe-retention")] = None,
    watch_tick_s: Annotated[float | None, _opt("watch_tick_s", "--watch-tick")] = None,
    watch_ping_s: Annotated[float | None, _opt("watch_ping_s", "--watch-ping")] = None,
    watch_history_mib: Annotated[float | None, _opt("watch_history_mib", "--watch-history-mib")] = None,
    watch_events: Annotated[int | None, _opt("watch_events", "--watch-events")] = None,
    replica_name: Annotated[str | None, _opt("replica_name", "--replica-name")] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning, error")] = "info",
    access_log: Annotated[bool, typer.Option("--access-log", help="log every request")] = False,
) -> None:
    """Run the controller API (migrates the database first; creates the bootstrap admin token on first start)."""
    from fleetctl.controller.server import serve as run

    settings = _settings(db_url=db_url, state_dir=state_dir, host=host, port=port, heartbeat_interval_s=heartbeat_interval,
                         down_after_s=down_after, reconcile_interval_s=reconcile_interval,
                         heartbeat_flush_s=heartbeat_flush, token_cache_s=token_cache_s,
                         max_body_bytes=max_body_bytes, migrate_on_start=migrate_on_start,
                         canary_budget_share=canary_budget_share, canary_capacity_window_s=canary_capacity_window_s,
                         canary_pinned_interval_s=canary_pinned_interval_s,
                         canary_production_interval_s=canary_production_interval_s,
                         canary_floor_interval_s=canary_floor_interval_s, canary_false_alarm_days=canary_false_alarm_days,
                         canary_urgent_interval_s=canary_urgent_interval_s,
                         canary_production_share=canary_production_share, canary_urgent_share=canary_urgent_share,
                         canary_shift=canary_shift, canary_min_probes=canary_min_probes,
                         canary_recovery_probes=canary_recovery_probes, canary_timeout_s=canary_timeout_s,
                         canary_concurrency=canary_concurrency, canary_webhook_url=canary_webhook_url,
                         canary_batch_conditions=canary_batch_conditions,
                         canary_budget_window_s=canary_budget_window_s,
                         canary_probe_retention_s=canary_probe_retention_s, watch_tick_s=watch_tick_s,
                         watch_ping_s=watch_ping_s, watch_history_mib=watch_history_mib, watch_events=watch_events,
                         replica_name=replica_name)
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
