"""`fleetctl status --watch`: the status view kept live from the controller's change stream.

The stream (fleetctl/watch_client.py `follow_sync`) is applied to a FleetState (fleetctl/watch_state.py);
the view is redrawn when a node, engine, gateway, the controller or the pulse changed, at most once every
MIN_REDRAW_S (changes in between are drawn together; the controller's pings, every ~2 s, make sure the
last of them is drawn). A table is drawn over the previous one on a terminal, appended otherwise;
`-o json` prints one JSON object per redraw on one line, `-o yaml` one YAML document each.

While the controller is unreachable the last view stays and each failed try prints one line on stderr,
`stale since HH:MM:SS: <why>; retrying in Ns`; the stream resumes by itself. `max_updates` ends the watch
after that many redraws (exit 0); Ctrl-C ends it with exit 130. Ages (a node's heartbeat, a gateway's last
report) are computed at the time of the last message, as the stream publishes them only with other changes.

Deployments are not in the change stream: `fleetctl status` without --watch shows them.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import typer
import yaml

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.output import Format, status
from fleetctl.cli.status_cmd import (
    ENGINE_COLUMNS, GATEWAY_COLUMNS, NODE_COLUMNS, drift_line, freeze_line, pin_line, render,
)
from fleetctl.client import ControllerClient
from fleetctl.controller.watch_contract import CONTROLLER_KEY, WatchMessage
from fleetctl.watch_client import Disconnected, follow_sync
from fleetctl.watch_state import FleetState

MIN_REDRAW_S = 1.0
SHOWN = ("controller", "pulse", "node", "engine", "gateway")  # the kinds the view draws
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen


def watch_status(client: ControllerClient, output: Format, max_updates: int | None, *,
                 source: Iterable[WatchMessage | Disconnected] | None = None,
                 clock: Callable[[], float] = time.monotonic, terminal: bool | None = None) -> int:
    """Follow the stream and draw (module docstring); the exit code."""
    items = follow_sync(client) if source is None else source
    clear = (sys.stdout.isatty() if terminal is None else terminal) and output is Format.table
    state, drawn, pending, last_draw = FleetState(), 0, False, None
    stale_since: datetime | None = None
    try:
        for item in items:
            if isinstance(item, Disconnected):
                stale_since = stale_since or item.at
                status(stale_line(stale_since, item))
                continue
            stale_since = None
            applied = state.apply(item)
            pending = pending or any(applied.touches(kind) for kind in SHOWN)
            if pending and (last_draw is None or clock() - last_draw >= MIN_REDRAW_S):
                gap = CLEAR if clear else "\n" if drawn and output is Format.table else ""
                typer.echo(gap + draw(state, output), color=True if clear else None)  # keep the escape codes
                drawn, pending, last_draw = drawn + 1, False, clock()
                if max_updates is not None and drawn >= max_updates:
                    return ExitCode.OK
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    return ExitCode.OK


def stale_line(since: datetime, gap: Disconnected) -> str:
    return f"stale since {since.astimezone():%H:%M:%S}: {' '.join(gap.error.split())}; retrying in {gap.retry_in_s:.1f}s"


def draw(state: FleetState, output: Format) -> str:
    view = plain_view(state)
    if output is Format.json:
        return json.dumps(view, separators=(",", ":"), default=str)
    if output is Format.yaml:
        return "---\n" + yaml.safe_dump(view, sort_keys=False, default_flow_style=False).rstrip()
    return render(heading(view), [("NODES", view["nodes"], NODE_COLUMNS), ("ENGINES", view["engines"], ENGINE_COLUMNS),
                                  ("GATEWAYS", view["gateways"], GATEWAY_COLUMNS)])


def plain_view(state: FleetState) -> dict[str, Any]:
    """The view as plain data: the stream's values, in key order, with ages as of the last message."""
    at = datetime.fromisoformat(state.at) if state.at else None

    def values(kind: str) -> list[dict[str, Any]]:
        return [state.resources.get(kind, {})[key] for key in sorted(state.resources.get(kind, {}))]

    return {
        "at": state.at, "token": state.token,
        "controller": state.resources.get("controller", {}).get(CONTROLLER_KEY),
        "pulse": state.resources.get("pulse", {}).get(CONTROLLER_KEY),
        "nodes": [_aged(n, "heartbeat_age_s", "last_heartbeat_at", at) for n in values("node")],
        "engines": values("engine"),
        "gateways": [_aged(g, "seen_ago_s", "last_seen", at) for g in values("gateway")],
    }


def _aged(value: dict[str, Any], age: str, since: str, at: datetime | None) -> dict[str, Any]:
    if at is None or not value.get(since):
        return value
    seconds = (at - datetime.fromisoformat(value[since])).total_seconds()
    return {**value, age: round(max(seconds, 0.0), 1)}


def heading(view: dict[str, Any]) -> str:
    controller, pulse = view["controller"] or {}, view["pulse"] or {}
    role = "leader" if controller.get("leader") else "follower"
    lines = [f"controller: {controller.get('replica', '?')} ({role}) at {_clock(view['at'])}"]
    if pulse:
        lines.append("pulse: " + pulse_line(pulse))
    if pulse.get("frozen"):
        lines.append(freeze_line())
    lines += [pin_line(model, ref) for model, ref in sorted((pulse.get("pins") or {}).items())]
    return "\n".join(lines) + drift_line(int(pulse.get("drifted") or 0))


def _ttft(pulse: dict[str, Any]) -> str:
    """The gateways' quantiles (streams); without streams in the window, the engines' mean of every request."""
    if pulse.get("ttft_p50_s") is None and pulse.get("ttft_engines_s") is not None:
        return f"TTFT mean {_s(pulse.get('ttft_engines_s'))} (engines)"
    return f"TTFT p50 {_s(pulse.get('ttft_p50_s'))} p90 {_s(pulse.get('ttft_p90_s'))}"


def pulse_line(pulse: dict[str, Any]) -> str:
    figures = [
        f"{_n(pulse.get('requests_s'))} req/s", f"{_n(pulse.get('tokens_s'))} tok/s",
        _ttft(pulse),
        f"ITL p90 {_s(pulse.get('itl_p90_s'))}", f"{_n(pulse.get('rejections_s'))} rejected/s",
        f"prefix hits {_percent(pulse.get('prefix_hit_rate'))}",
        f"routing table {_s(pulse.get('routing_table_age_s'))} old",
        f"engines {pulse.get('engines_ready', 0)}/{pulse.get('engines', 0)} ready",
        f"nodes {pulse.get('nodes_up', 0)}/{pulse.get('nodes', 0)} up",
    ]
    return " · ".join(figures)


def _clock(at: str | None) -> str:
    return datetime.fromisoformat(at).astimezone().strftime("%H:%M:%S") if at else "-"


def _n(value: float | None) -> str:
    """3 significant figures, thousands as k: 0.25, 12.3, 4.5k."""
    if value is None:
        return "-"
    return f"{value / 1000:.3g}k" if value >= 1000 else f"{value:.3g}"


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"
