"""`fleetctl rollout watch`: the screen an operator leaves open, and the exit code a script waits for.

`watch(fetch)` polls `fetch` (the rollout's `RolloutView`, e.g. `lambda: api.get_rollout(7)`) every
`interval_s` and shows it:

- on a terminal, as a live screen (rich.live.Live) redrawn in place, sized to the terminal;
- otherwise (a pipe, a CI log), as one line (`summary_line`) each time that line changes.

It returns, with one line on stderr saying why:

| exit | when |
|---|---|
| 0 `OK` | the rollout completed (all traffic on B) |
| 8 `ROLLOUT_ABORTED` | the rollout ended aborted (all traffic back on A) |
| 9 `ROLLOUT_PAUSED` | with `exit_on_pause`: the rollout waits for an operator (not a timed pause) |
| 1 `ERROR` | `timeout_s` passed first |
| 130 `INTERRUPTED` | Ctrl-C; the rollout itself continues |

A refresh that fails because the controller is unreachable or answers 5xx is shown on the screen (with
the age of the last good view) and retried; other errors (404: no such rollout, 401/403) end the watch
through the CLI's usual error line and exit code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from rich.console import Console, RenderableType
from rich.live import Live

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.output import status
from fleetctl.cli.rollout_render import duration, render, render_waiting, step_position, summary_line
from fleetctl.controller.rollout.state import ABORTED, COMPLETED, PAUSE_STEP, PAUSED
from fleetctl.controller.rollout.view import RolloutView
from fleetctl.errors import FleetError, Unavailable

__all__ = ["watch", "render", "summary_line", "outcome", "waits_for_operator"]


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


# --- what a view means for the watch (pure) ---

def waits_for_operator(view: RolloutView) -> bool:
    """Paused until someone acts: an indefinite pause step, an inconclusive analysis, an operator's pause,
    drift, a freeze. A timed pause step ends by itself."""
    return view.phase == PAUSED and not (view.pause_reason == PAUSE_STEP and view.pause_left_s is not None)


def outcome(view: RolloutView, exit_on_pause: bool = False) -> ExitCode | None:
    """The exit code the watch ends with for `view`, or None to keep watching."""
    if view.phase == COMPLETED:
        return ExitCode.OK
    if view.phase == ABORTED:
        return ExitCode.ROLLOUT_ABORTED
    if exit_on_pause and waits_for_operator(view):
        return ExitCode.ROLLOUT_PAUSED
    return None


def final_line(view: RolloutView, code: ExitCode) -> str:
    if code is ExitCode.OK:
        return f"rollout #{view.id} completed: all of {view.model}'s traffic on {view.to_ref}"
    if code is ExitCode.ROLLOUT_ABORTED:
        reason = f": {view.abort_reason}" if view.abort_reason else ""
        return f"rollout #{view.id} aborted{reason}; traffic back on {view.from_ref}"
    return (f"rollout #{view.id} paused at {step_position(view)} and waits for an operator "
            f"(fleetctl rollout promote|resume|abort {view.id})")


def retryable(exc: FleetError) -> bool:
    """A refresh worth retrying: the controller is unreachable, overloaded or failing, not a refusal."""
    return isinstance(exc, Unavailable) or exc.status >= 500


# --- the loop ---

@dataclass
class _Seen:
    """What the watch knows between refreshes."""

    view: RolloutView | None = None
    fetched_at: float | None = None  # clock() of the last good fetch
    problem: str | None = None


def watch(fetch: Callable[[], RolloutView], *, interval_s: float = 1.0, timeout_s: float | None = None,
          console: Console | None = None, sleep: Callable[[float], None] = time.sleep,
          clock: Callable[[], float] = time.monotonic, now: Callable[[], datetime] = _utcnow,
          exit_on_pause: bool = False, live: bool | None = None) -> int:
    """Refresh until the rollout completes, aborts, (with `exit_on_pause`) waits for an operator, or
    `timeout_s` passes; returns the exit code (module docstring). `live`: None follows whether `console`
    is a terminal."""
    console = console or Console()
    screen = _LiveScreen(console, now) if (console.is_terminal if live is None else live) else _LineScreen(console)
    seen = _Seen()
    try:
        with screen:  # the last screen stays; the one-line ending is printed below it, after the live redraws
            code, line = _loop(fetch, seen, screen, interval_s, timeout_s, sleep, clock, exit_on_pause)
    except KeyboardInterrupt:
        code, line = ExitCode.INTERRUPTED, _interrupted_line(seen)
    status(line)
    return code


def _loop(fetch: Callable[[], RolloutView], seen: _Seen, screen: _LiveScreen | _LineScreen, interval_s: float,
          timeout_s: float | None, sleep: Callable[[float], None], clock: Callable[[], float],
          exit_on_pause: bool) -> tuple[ExitCode, str]:
    start = clock()
    while True:
        _refresh(fetch, seen, clock, interval_s)
        screen.show(seen)
        code = outcome(seen.view, exit_on_pause) if seen.view is not None and not seen.problem else None
        if code is not None:
            return code, final_line(seen.view, code)
        if timeout_s is not None and clock() - start >= timeout_s:
            return ExitCode.ERROR, _timeout_line(seen, timeout_s)
        sleep(interval_s)


def _refresh(fetch: Callable[[], RolloutView], seen: _Seen, clock: Callable[[], float], interval_s: float) -> None:
    try:
        view = fetch()
    except FleetError as exc:
        if not retryable(exc):
            raise
        seen.problem = _problem_line(exc, seen, clock(), interval_s)
        return
    seen.view, seen.fetched_at, seen.problem = view, clock(), None


def _problem_line(exc: FleetError, seen: _Seen, at: float, interval_s: float) -> str:
    line = f"cannot refresh: {' '.join(exc.message.split())}; retrying every {interval_s:g}s"
    if seen.fetched_at is not None:
        line += f" · showing the view from {duration(at - seen.fetched_at)} ago"
    return line


def _timeout_line(seen: _Seen, timeout_s: float) -> str:
    if seen.view is None:
        return f"timed out after {timeout_s:g}s without reaching the controller"
    view = seen.view
    return (f"timed out after {timeout_s:g}s: rollout #{view.id} is {view.phase} at {step_position(view)}; "
            f"it continues (fleetctl rollout status {view.id})")


def _interrupted_line(seen: _Seen) -> str:
    if seen.view is None:
        return "stopped watching; the rollout itself continues"
    view = seen.view
    return (f"stopped watching; rollout #{view.id} itself continues ({view.phase}, {step_position(view)}; "
            f"fleetctl rollout status {view.id})")


class _LiveScreen:
    """A terminal: the whole screen, redrawn in place at the terminal's current width."""

    def __init__(self, console: Console, now: Callable[[], datetime]):
        self.console, self.now = console, now
        self.live = Live(console=console, auto_refresh=False, transient=False, redirect_stdout=False,
                         redirect_stderr=False)

    def __enter__(self) -> "_LiveScreen":
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def show(self, seen: _Seen) -> None:
        self.live.update(self._screen(seen), refresh=True)

    def _screen(self, seen: _Seen) -> RenderableType:
        width, height = self.console.size
        if seen.view is None:
            return render_waiting(seen.problem or "waiting for the controller", width)
        return render(seen.view, self.now(), width, problem=seen.problem, height=height)


class _LineScreen:
    """Not a terminal: one line whenever it changes (no colour, no cursor movement)."""

    def __init__(self, console: Console):
        self.console, self.last = console, ""

    def __enter__(self) -> "_LineScreen":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def show(self, seen: _Seen) -> None:
        line = seen.problem if seen.problem else summary_line(seen.view) if seen.view is not None else ""
        if line and line != self.last:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            self.last = line
