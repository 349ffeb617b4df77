"""Actions an operator takes from the TUI. Each is an `Action`: what it does in words, the exact equivalent
`fleetctl` command, and the call that does it through the typed async client. `request_action` shows the
confirmation (ui/widgets/confirm.py: the command, a reason field, OK / Cancel) and, confirmed, runs the call
in a worker, posting ActionDone back. A read-only app (--readonly, or a viewer token) refuses every action
and says why, without showing the confirmation.

The command is the one that makes the same call with the same reason and does nothing more: `--no-wait`
where the CLI would wait for engines to stop or gateways to apply (the TUI shows that live instead), and
`--yes` where the CLI would ask (the TUI has asked). Its reason reads `--reason '<reason>'` until one is
typed; `command_for(reason)` fills it in, quoted for a POSIX shell.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fleetctl.client import AsyncControllerClient
from fleetctl.errors import FleetError
from ui.messages import ActionDone

REASON_PLACEHOLDER = "<reason>"
_REASON_OPTION = f"--reason {shlex.quote(REASON_PLACEHOLDER)}"
WORKER_GROUP = "actions"


@dataclass(frozen=True)
class Action:
    title: str  # "Drain node node-1"
    command: str  # the exact fleetctl command, reason included as --reason '<reason>' (shown with <reason>)
    run: Callable[[AsyncControllerClient, str], Awaitable[Any]]  # (client, reason) -> the API's answer
    destructive: bool = True
    done: Callable[[Any], str] | None = None  # the API's answer in one line, for the notification

    def command_for(self, reason: str) -> str:
        """The command with `reason` in place of <reason> (unchanged while the reason is empty)."""
        if not reason.strip():
            return self.command
        head, found, tail = self.command.rpartition(_REASON_OPTION)
        return f"{head}--reason {shlex.quote(reason.strip())}{tail}" if found else self.command


def _command(*words: str) -> str:
    return " ".join(["fleetctl", *(shlex.quote(word) for word in words), _REASON_OPTION])


# --- nodes and engines ---

def drain_node(name: str) -> Action:
    return Action(f"Drain node {name}", _command("node", "drain", name, "--no-wait", "--yes"),
                  lambda client, reason: client.drain_node(name, reason),
                  done=lambda _: f"node {name}: cordoned, engines draining")


def cordon_node(name: str) -> Action:
    return Action(f"Cordon node {name}", _command("node", "cordon", name, "--yes"),
                  lambda client, reason: client.cordon_node(name, reason),
                  done=lambda result: f"node {name}: cordoned" + _already(result))


def uncordon_node(name: str) -> Action:
    return Action(f"Uncordon node {name}", _command("node", "uncordon", name),
                  lambda client, reason: client.uncordon_node(name, reason), destructive=False,
                  done=lambda result: f"node {name}: schedulable" + _already(result))


def drain_engine(node: str, name: str) -> Action:
    """Engines are named uniquely fleet-wide (`<deployment>-<index>`); `node` is for the title."""
    return Action(f"Drain engine {name} on {node}", _command("engine", "drain", name, "--no-wait", "--yes"),
                  lambda client, reason: client.drain_engine(name, reason),
                  done=lambda _: f"engine {name}: draining")


def cordon_engine(node: str, name: str) -> Action:
    return Action(f"Cordon engine {name} on {node}", _command("engine", "cordon", name, "--no-wait", "--yes"),
                  lambda client, reason: client.cordon_engine(name, reason),
                  done=lambda result: f"engine {name}: cordoned, no new requests" + _already(result))


def uncordon_engine(node: str, name: str) -> Action:
    return Action(f"Uncordon engine {name} on {node}", _command("engine", "uncordon", name, "--no-wait"),
                  lambda client, reason: client.uncordon_engine(name, reason), destructive=False,
                  done=lambda result: f"engine {name}: in traffic" + _already(result))


def _already(result: Any) -> str:
    return " (already)" if getattr(result, "result", None) == "unchanged" else ""


# --- rollouts ---

def _rollout(verb: str, model: str, rollout_id: int, title: str, *, full: bool = False,
             destructive: bool = True) -> Action:
    words = ["rollout", verb, str(rollout_id)] + (["--full"] if full else [])

    async def run(client: AsyncControllerClient, reason: str) -> Any:
        return await client.rollout_command(rollout_id, verb, full=full, reason=reason)

    return Action(title, _command(*words), run, destructive=destructive,
                  done=lambda view: f"rollout {rollout_id} ({model}): {verb} -> {getattr(view, 'phase', '?')}")


def pause_rollout(model: str, rollout_id: int) -> Action:
    return _rollout("pause", model, rollout_id, f"Pause rollout {rollout_id} of {model}", destructive=False)


def resume_rollout(model: str, rollout_id: int) -> Action:
    return _rollout("resume", model, rollout_id, f"Resume rollout {rollout_id} of {model}", destructive=False)


def promote_rollout(model: str, rollout_id: int, full: bool = False) -> Action:
    title = (f"Promote rollout {rollout_id} of {model} fully (all traffic to B now)" if full
             else f"Promote rollout {rollout_id} of {model} (end this pause or analysis)")
    return _rollout("promote", model, rollout_id, title, full=full)


def abort_rollout(model: str, rollout_id: int) -> Action:
    return _rollout("abort", model, rollout_id, f"Abort rollout {rollout_id} of {model} (all traffic back to A)")


# --- traffic ---

def format_weights(weights: dict[str, float]) -> str:
    return " ".join(f"{ref}={weight:g}" for ref, weight in weights.items())


def set_weights(model: str, weights: dict[str, float]) -> Action:
    chosen = dict(weights)
    pairs = [f"{ref}={weight:g}" for ref, weight in chosen.items()]
    return Action(f"Set {model}'s traffic weights to {format_weights(chosen)}",
                  _command("traffic", "set", model, *pairs, "--no-wait"),
                  lambda client, reason: client.set_traffic(model, chosen, False, reason),
                  done=lambda result: f"traffic {model}: {getattr(result, 'result', '?')} "
                                      f"(routing generation {getattr(result, 'generation', '?')})")


# --- asking and running ---

def one_line(exc: BaseException) -> str:
    """The error as the CLI prints it: one line, whatever the server sent."""
    if isinstance(exc, FleetError):
        return " ".join(exc.message.split())
    return f"unexpected {type(exc).__name__}: {' '.join(str(exc).split())}"


def request_action(app: Any, action: Action) -> None:
    """Confirm `action` (a modal over the current screen) and run it; refused when the app is read-only."""
    if app.readonly:
        refusal = f"read-only: {app.readonly_reason or '--readonly'}"
        app.notify(refusal, title=action.title, severity="warning", markup=False)
        app.post_message(ActionDone(action.title, False, refusal))
        return
    from ui.widgets.confirm import ConfirmScreen  # the widget imports this module's Action

    def confirmed(reason: str | None) -> None:
        if reason is not None:
            # The app owns the worker: the confirmation is gone by now, and a worker dies with its node.
            app.run_worker(perform(app, action, reason), name=action.title, group=WORKER_GROUP,
                           exit_on_error=False)

    app.push_screen(ConfirmScreen(action), callback=confirmed)


async def perform(app: Any, action: Action, reason: str) -> bool:
    """Run the confirmed action's call; say how it went (a notification and ActionDone)."""
    client = app.client
    if client is None:
        return _finish(app, action, False, "no connection to a controller")
    try:
        result = await action.run(client, reason)
    except Exception as exc:  # a refusal or an outage is the operator's news, never the TUI's end
        return _finish(app, action, False, one_line(exc))
    return _finish(app, action, True, action.done(result) if action.done else f"{action.title}: done")


def _finish(app: Any, action: Action, ok: bool, detail: str) -> bool:
    if ok:
        app.notify(detail, title=action.title, markup=False)
    else:
        app.notify(detail, title=f"{action.title}: failed", severity="error", timeout=10, markup=False)
    app.post_message(ActionDone(action.title, ok, detail))
    return ok


# --- P:D ---

def rebalance(model: str, prefill: int, decode: int) -> Action:
    """Flip one engine at a time to prefill:decode (the CLI's `pd rebalance --apply`)."""
    return Action(f"Rebalance {model} to {prefill}P:{decode}D (engines drain and restart, one at a time)",
                  _command("pd", "rebalance", model, "--prefill", str(prefill), "--decode", str(decode), "--apply",
                           "--no-wait", "--yes"),
                  lambda client, reason: client.pd_rebalance(model, prefill, decode, apply=True, reason=reason),
                  done=lambda result: f"{model}: rebalance " + (
                      f"#{result.rebalance.id} started" if getattr(result, "rebalance", None) else "not needed"))


def stop_rebalance(model: str, rebalance_id: int) -> Action:
    return Action(f"Stop rebalance #{rebalance_id} of {model} after the flip in progress",
                  _command("pd", "stop", str(rebalance_id)),
                  lambda client, reason: client.stop_rebalance(rebalance_id, reason), destructive=False,
                  done=lambda _: f"rebalance #{rebalance_id}: stops after the flip in progress")
