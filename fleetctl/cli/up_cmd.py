"""`fleetctl up` and `fleetctl down`: a whole fleet on this machine (fleetctl/localfleet/).

    fleetctl up [--nodes 2] [--model smollm2|tiny] [--detach] [--state-dir DIR]
    fleetctl down [--state-dir DIR] [--yes]

Both sit at the top level: NAME is None, so main.py merges this module's commands into the root.
Progress goes to stderr; where everything is goes to stdout (`-o json` for scripts).
"""

from __future__ import annotations

import json
import shlex
import signal
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from fleetctl.cli.context import YesOption
from fleetctl.cli.output import Format, OutputOption, col, emit, status
from fleetctl.client import DEFAULT_CONTROLLER
from fleetctl.controller.paths import default_state_dir

NAME = None
app = typer.Typer(help="A local fleet: up, down.")

StateDirOption = Annotated[Path | None, typer.Option(
    "--state-dir", help="the fleet's state, logs and PIDs [default: $FLEET_STATE_DIR or ~/.local/state/fleetctl]",
    show_default=False)]
REPORT_COLUMNS = [col("KIND", "kind"), col("NAME", "name"), col("PID", "pid"), col("RESULT", "result")]


class Model(str, Enum):
    smollm2 = "smollm2"
    tiny = "tiny"


@app.command()
def up(
    nodes: Annotated[int, typer.Option("--nodes", min=1, max=32, help="agents (nodes) to start, one engine each")] = 2,
    model: Annotated[Model, typer.Option("--model", help="smollm2 (SmolLM2-135M-Instruct) or tiny (random weights, for tests)")] = Model.smollm2,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="return once the engines are ready; stop with `fleetctl down`")] = False,
    state_dir: StateDirOption = None,
    controller_port: Annotated[int, typer.Option("--controller-port", help="controller port (0: any free port)")] = 8080,
    engine_port_base: Annotated[int, typer.Option("--engine-port-base", help="node i's engines use ports BASE+100*i ...")] = 8100,
    gateway_port: Annotated[int, typer.Option("--gateway-port", help="gateway port, the OpenAI front door (0: any free port)")] = 8000,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds to wait for the engines to be ready")] = 900.0,
    output: OutputOption = Format.table,
) -> None:
    """Start a controller (SQLite), NODES agents and a deployment with one engine per node on loopback, and wait
    until the engines are ready. In the foreground Ctrl-C stops everything; with --detach, `fleetctl down` does."""
    from fleetctl.localfleet import UpOptions, down as fleet_down, up as fleet_up

    options = UpOptions(state_dir=(state_dir or default_state_dir()), nodes=nodes, model=model.value,
                        controller_port=controller_port, engine_port_base=engine_port_base,
                        gateway_port=gateway_port, ready_timeout_s=timeout)
    record = fleet_up(options, progress=status)
    _print_fleet(record, output, detach)
    if detach:
        return
    _stay_until_interrupted(record)
    status("stopping the local fleet ...")
    _emit_report(fleet_down(Path(record.state_dir)), Format.table)


@app.command()
def down(
    state_dir: StateDirOption = None,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds each group of processes has to exit before SIGKILL")] = 60.0,
    output: OutputOption = Format.table,
    yes: YesOption = False,  # accepted as every destructive command accepts it; `down` asks nothing
) -> None:
    """Stop the local fleet started by `fleetctl up` (agents and their engines, then the controller)."""
    from fleetctl.localfleet import LocalFleetError, down as fleet_down

    where = state_dir or default_state_dir()
    try:
        report = fleet_down(where, timeout_s=timeout)
    except LocalFleetError as exc:
        if exc.code != "no_fleet":
            raise
        status(f"no local fleet in {where.resolve()}: nothing to stop")
        return
    _emit_report(report, output)


def _emit_report(report: list[dict[str, str]], output: Format) -> None:
    emit(report, output, REPORT_COLUMNS)
    killed = [row["name"] for row in report if row["result"] == "killed"]
    status("local fleet stopped" + (f"; killed after the timeout: {', '.join(killed)}" if killed else ""))


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _stay_until_interrupted(record: Any) -> None:
    """Block until Ctrl-C or SIGTERM, saying so if one of the fleet's processes exits meanwhile."""
    from fleetctl.localfleet import processes

    signal.signal(signal.SIGTERM, _interrupt)
    status("the fleet runs in the foreground: Ctrl-C stops it")
    gone: set[str] = set()
    try:
        while True:
            time.sleep(2.0)
            for info in record.processes:
                if info.name not in gone and (how := processes.exit_status(info)) is not None:
                    gone.add(info.name)
                    status(f"{info.kind} {info.name} exited ({how}); see {info.log_path}")
    except KeyboardInterrupt:
        pass


def _print_fleet(record: Any, output: Format, detached: bool) -> None:
    if output is not Format.table:
        emit(record.to_json(), output)
        return
    state_dir = Path(record.state_dir)
    agents = record.of_kind("agent")
    controller = record.of_kind("controller")[0]
    lines = [
        f"local fleet up: {len(agents)} node(s), model {record.served_model}",
        f"  controller  {record.controller_url}  (pid {controller.pid})",
        f"  token file  {record.token_file}",
        *[f"  agent       {a.name}  {a.url}  (pid {a.pid})" for a in agents],
        *[f"  engine      {e['name']} on {e['node']}  {e['url']}" for e in record.engines],
        f"  logs        {record.log_dir} (controller, agents); engines: {state_dir}/agents/NODE/logs",
    ]
    if record.gateway_url:
        lines.insert(2, f"  gateway     {record.gateway_url}")
    typer.echo("\n".join(lines) + "\n\n" + _how_to_use(record, detached))


def _how_to_use(record: Any, detached: bool) -> str:
    state_dir = Path(record.state_dir)
    env = "" if state_dir == default_state_dir().resolve() else f"FLEET_STATE_DIR={shlex.quote(str(state_dir))} "
    controller = "" if record.controller_url == DEFAULT_CONTROLLER else f" --controller {record.controller_url}"
    down_args = "" if not env else f" --state-dir {shlex.quote(str(state_dir))}"
    served = record.gateway_url or (record.engines[0]["url"] if record.engines else "http://127.0.0.1:8100")
    body = {"model": record.served_model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}
    return "\n".join([
        "try it:",
        f"  curl -s {served}/v1/chat/completions -H 'Content-Type: application/json' -d '{json.dumps(body)}'",
        f"  {env}fleetctl{controller} status",
        f"  {env}fleetctl{controller} tui      (the live fleet view; q quits)",
        f"  fleetctl down{down_args}" + ("" if detached else "    (or Ctrl-C here)"),
    ])
