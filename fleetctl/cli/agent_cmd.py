"""`fleetctl agent serve|engines|drain|restart|stop`, and `fleetctl engine serve`.

    fleetctl agent serve --controller URL --node NAME [--token-file F] [--port-range 8100-8999] ...
    fleetctl agent engines --agent URL                      # what an agent runs (no controller needed)
    fleetctl agent drain|restart|stop ENGINE --agent URL    # break-glass, with the agent's admin token
    fleetctl engine serve [engine.reference flags ...]      # one reference engine in the foreground

`engine serve` joins the `engine` noun of engine_cmd.py (mounted when this module is imported, which
main.py does before it runs any command). `agent serve`'s options are AgentSettings' fields
(fleetctl/cli/settings_options.py): their help and defaults come from the settings class. Of the agent and
engine packages only the settings modules load with the CLI; the rest is imported inside the commands.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from agent.settings import AgentSettings
from engine.process_settings import plain_default
from fleetctl.cli import engine_cmd
from fleetctl.cli.context import YesOption, cli, local_token
from fleetctl.cli.output import Format, JsonOutputOption, col, emit, status
from fleetctl.cli.settings_options import OptionMap, build_settings, given, setting_option
from fleetctl.errors import Conflict, Unavailable, ValidationFailed, error_from_body
from fleetctl.inventory import AGENT_CREDENTIAL_FILE

NAME = "agent"
app = typer.Typer(no_args_is_help=True, help="Run a node agent, or act on one directly (break-glass).")

ADMIN_TOKEN_FILE = AGENT_CREDENTIAL_FILE
QUIET_LOGGERS = ("httpx", "httpcore", "uvicorn.access")

AgentOption = Annotated[str, typer.Option("--agent", envvar="FLEET_AGENT_URL", help="the agent's URL, e.g. http://127.0.0.1:8090")]


# --- fleetctl agent serve ---------------------------------------------------------------------------------


def _opt(field: str, *flags: str, **kwargs: Any) -> Any:
    return setting_option(AgentSettings, field, *flags, **kwargs)


SERVE_OPTIONS = OptionMap(
    settings=AgentSettings,
    renamed={"controller": "controller_url", "token_file": "token", "label": "labels",
             "admin_token_file": "admin_token"},
    not_settings={"log_level": "how much the process logs, not how the agent behaves"},
    not_options={
        "controller_backoff": "a structured delay schedule (agent/backoff.py), tuned in code and injected by tests",
        "restart_backoff": "a structured delay schedule (agent/backoff.py), tuned in code and injected by tests",
        "admin_token_file": "set from --admin-token-file, the option `admin_token` is read from",
        "kv_tier_token": "a fresh random credential per agent start, handed to the engines it launches; nothing else "
                         "needs to know it",
    },
)


@app.command()
def serve(
    ctx: typer.Context,
    node: Annotated[str, _opt("node", "--node", envvar="FLEET_NODE")],
    controller: Annotated[str | None, _opt("controller_url", "--controller",
                                           default_text="fleetctl --controller / $FLEET_CONTROLLER")] = None,
    token_file: Annotated[Path | None, _opt("token", "--token-file", metavar="FILE", help_prefix="file holding the ",
                                            default_text="--token / $FLEET_TOKEN, else the local bootstrap token")] = None,
    host: Annotated[str | None, _opt("host", "--host")] = None,
    advertise_host: Annotated[str | None, _opt("advertise_host", "--advertise-host")] = None,
    port: Annotated[int | None, _opt("port", "--port", default_text=f"{plain_default(AgentSettings, 'port')}; "
                                     "0: any free port")] = None,
    port_range: Annotated[str | None, _opt("port_range", "--port-range", metavar="LOW-HIGH",
                                           default_text="%d-%d" % plain_default(AgentSettings, "port_range"))] = None,
    state_dir: Annotated[Path | None, _opt("state_dir", "--state-dir", default_text="$FLEET_STATE_DIR/agents/NODE")] = None,
    label: Annotated[list[str] | None, _opt("labels", "--label", metavar="KEY=VALUE")] = None,
    admin_token_file: Annotated[Path | None, _opt("admin_token", "--admin-token-file", metavar="FILE", help_prefix="file holding the ",
                                                  default_text="STATE_DIR/admin-token, created if missing")] = None,
    max_engines: Annotated[int | None, _opt("max_engines", "--max-engines")] = None,
    kv_mib: Annotated[int | None, _opt("kv_mib", "--kv-mib")] = None,
    hash_seed: Annotated[str | None, _opt("hash_seed", "--hash-seed")] = None,
    python: Annotated[str | None, _opt("python", "--python")] = None,
    vllm_executable: Annotated[str | None, _opt("vllm_executable", "--vllm-executable")] = None,
    tick_s: Annotated[float | None, _opt("tick_s", "--tick-s")] = None,
    startup_timeout_s: Annotated[float | None, _opt("startup_timeout_s", "--startup-timeout-s")] = None,
    unhealthy_after: Annotated[int | None, _opt("unhealthy_after", "--unhealthy-after")] = None,
    stop_timeout_s: Annotated[float | None, _opt("stop_timeout_s", "--stop-timeout-s")] = None,
    drain_timeout_s: Annotated[float | None, _opt("drain_timeout_s", "--drain-timeout-s")] = None,
    stable_after_s: Annotated[float | None, _opt("stable_after_s", "--stable-after-s")] = None,
    request_timeout_s: Annotated[float | None, _opt("request_timeout_s", "--request-timeout-s")] = None,
    keep_engines_on_exit: Annotated[bool | None, _opt("keep_engines_on_exit", "--keep-engines-on-exit")] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning, error")] = "info",
) -> None:
    """Run this node's agent until SIGTERM or Ctrl-C: register, heartbeat, run the assigned engines."""
    from agent.ports import free_port, parse_port_range
    from agent.runtime import AgentStartError
    from agent.runtime import serve as run_agent
    from fleetctl.client import AsyncControllerClient
    from fleetctl.controller.paths import default_state_dir

    root = cli(ctx)
    state = state_dir or default_state_dir() / "agents" / node
    try:
        engine_ports = parse_port_range(port_range) if port_range is not None else None
    except ValueError as exc:
        raise ValidationFailed(str(exc), field="port_range") from None
    settings = build_settings(AgentSettings, {
        "controller_url": (controller or root.controller).rstrip("/"), "node": node,
        "token": _read_secret(token_file) if token_file else root.token or local_token(),
        "state_dir": state, "labels": _labels(label or []),
        "admin_token": ensure_secret(admin_token_file or state / ADMIN_TOKEN_FILE),
        "admin_token_file": admin_token_file or state / ADMIN_TOKEN_FILE,
        **given(host=host, advertise_host=advertise_host,
                port=free_port(host or plain_default(AgentSettings, "host")) if port == 0 else port,
                port_range=engine_ports, max_engines=max_engines, kv_mib=kv_mib, hash_seed=hash_seed, python=python,
                vllm_executable=vllm_executable, tick_s=tick_s, startup_timeout_s=startup_timeout_s,
                unhealthy_after=unhealthy_after, stop_timeout_s=stop_timeout_s, drain_timeout_s=drain_timeout_s,
                stable_after_s=stable_after_s, request_timeout_s=request_timeout_s,
                keep_engines_on_exit=keep_engines_on_exit),
    })
    _configure_logging(log_level)
    try:
        run_agent(settings, AsyncControllerClient(settings.controller_url, token=settings.token, timeout=settings.request_timeout_s))
    except AgentStartError as exc:
        raise Conflict(str(exc), code="port_taken", field="port") from None


def _labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValidationFailed(f"--label {pair!r} is not KEY=VALUE", field="label")
        labels[key] = value
    return labels


def ensure_secret(path: Path) -> str:
    """The token in `path`, or a new one written there (mode 0600) when the file does not exist yet."""
    if path.exists():
        return _read_secret(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token


def _read_secret(path: Path) -> str:
    token = path.read_text().strip()  # an unreadable file is an OSError: exit code 2 with its name
    if not token:
        raise ValidationFailed(f"{path} is empty", field="token_file")
    return token


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


# --- break-glass: talk to an agent directly, no controller needed -----------------------------------------


AGENT_ENGINE_COLUMNS = [col("ENGINE", "name"), col("STATE", "state"), col("ROLE", "role"), col("CLASS", "class_ref"),
                        col("URL", "url"), col("PID", "pid"), col("RESTARTS", "restarts")]


@app.command()
def engines(agent: AgentOption, output: JsonOutputOption = Format.json) -> None:
    """What the agent runs, as it reports it (JSON on stdout unless -o says otherwise)."""
    emit(_call_agent(agent, None, lambda client: client.engines()), output, AGENT_ENGINE_COLUMNS)


def _break_glass(action: str, summary: str) -> Any:
    def command(
        engine: Annotated[str, typer.Argument(help="engine name, e.g. local-0")],
        agent: AgentOption,
        admin_token_file: Annotated[Path, typer.Option("--admin-token-file", envvar="FLEET_AGENT_ADMIN_TOKEN_FILE",
                                                       help="the agent's admin token file (its STATE_DIR/admin-token)")],
        yes: YesOption = False,  # break-glass acts at once, as in an incident it must; --yes is accepted for scripts
    ) -> None:
        result = _call_agent(agent, _read_secret(admin_token_file), lambda client: client.act(engine, action))
        typer.echo(json.dumps(result))
        status(f"{action} of {engine} accepted by {agent}")

    command.__doc__ = f"Break-glass, without the controller: {summary}"
    return command


app.command("drain")(_break_glass("drain", "drain ENGINE (finish in-flight requests, then stop); it stays down until the controller sends a new assignment."))
app.command("restart")(_break_glass("restart", "restart ENGINE's process (also ends a drain/stop hold)."))
app.command("stop")(_break_glass("stop", "stop ENGINE now (SIGTERM: the engine drains within its grace); it stays down until a new assignment."))


def _call_agent(url: str, admin_token: str | None, call: Any) -> Any:
    """One call to an agent's local API; its errors become the control plane's error family (exit codes)."""
    from agent.client import AgentApiError, AgentClient

    try:
        return call(AgentClient(url, admin_token=admin_token))
    except AgentApiError as exc:
        raise (Unavailable(exc.message) if exc.status == 0 else error_from_body(exc.status, exc.body)) from None


# --- fleetctl engine serve --------------------------------------------------------------------------------


@engine_cmd.app.command(
    "serve", add_help_option=False,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def engine_serve(ctx: typer.Context) -> None:
    """Run a reference engine in the foreground. Every argument goes to `python -m engine.reference`
    (see `fleetctl engine serve --help`)."""
    from engine.reference.__main__ import main as engine_main

    raise typer.Exit(engine_main(list(ctx.args)))
