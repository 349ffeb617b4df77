"""The operator's commands on a rollout, as pure functions over its persisted state (the API applies them
under the rollout's version check, audits them, and records one history event each). Each returns the next
state, or raises CommandRefused (a 409 with a one-line message) when the rollout's state does not allow it;
the machine does the rest on its next reconcile.

Argo Rollouts' semantics (../shared/reference/rollouts.md, section 2):
- `pause`: the operator holds the rollout; nothing moves and nothing is measured until `resume` or `promote`.
- `resume`: lifts an operator's pause, and only that (a pause step or an inconclusive analysis waits for
  `promote`; a break-glass freeze for the freeze to lift).
- `promote`: lifts an operator's pause, then moves past a pause step (timed or not), past an inconclusive or
  still running step analysis, and restarts an inconclusive background analysis. `full`: every remaining step,
  pause and analysis is skipped and the rollout goes straight to 100% on B (B still scaled and ready first).
- `abort`: traffic back to A, acknowledged, then B drained; the spec keeps B, so `retry` tries it again.
- `retry`: from aborted only, the steps run again from step 0.
"""

from __future__ import annotations

from datetime import datetime

from fleetctl.controller.rollout.analysis import stop
from fleetctl.controller.rollout.state import (
    ABORTED, ABORTING, BREAK_GLASS, BY_OPERATOR, COMPLETED, DRIFT, FREEZE, HOLD_REASONS, INCONCLUSIVE,
    INCONCLUSIVE_PHASE, PAUSE_STEP, PAUSED, PENDING, PIN, PROGRESSING, RUNNING, RolloutState,
)
from fleetctl.errors import Conflict


class CommandRefused(Conflict):
    """The rollout's state does not allow the command: 409, `code` a machine word, `message` one line."""

    def __init__(self, code: str, message: str):
        super().__init__(message, code=code)


def pause(state: RolloutState, by: str, now: datetime) -> RolloutState:
    """Hold the rollout for `by` (an operator's token name). The step's own pause reason, if any, stays."""
    _refuse_finished(state, "paused")
    if state.phase == ABORTING:
        raise CommandRefused("rollout_aborting", "the rollout is aborting: traffic is going back to A; wait for it")
    if state.paused_by is not None and state.paused_by not in BREAK_GLASS:
        raise CommandRefused("already_paused", f"the rollout is already paused by {state.paused_by}")
    reason = state.pause_reason if state.pause_reason not in (None, *HOLD_REASONS.values()) else BY_OPERATOR
    return state.but(phase=PAUSED, paused_by=by, pause_reason=reason, updated_at=now,
                     message=f"paused by {by}")


def resume(state: RolloutState, now: datetime) -> RolloutState:
    """Lift an operator's pause."""
    _refuse_finished(state, "resumed")
    if state.paused_by in BREAK_GLASS:
        raise CommandRefused(_HELD_CODES[state.paused_by], f"{_HELD[state.paused_by]}: the rollout resumes when it lifts")
    if state.paused_by is None:
        raise CommandRefused("not_paused_by_operator", _why_not_resumable(state))
    return state.but(phase=PROGRESSING, paused_by=None, pause_reason=_step_reason(state), updated_at=now,
                     message="resumed")


def promote(state: RolloutState, now: datetime, full: bool = False) -> RolloutState:
    """Argo's promote (see the module docstring)."""
    _refuse_finished(state, "promoted")
    if state.phase == ABORTING:
        raise CommandRefused("rollout_aborting", "the rollout is aborting: nothing to promote")
    if state.paused_by in BREAK_GLASS:
        raise CommandRefused(_HELD_CODES[state.paused_by], f"{_HELD[state.paused_by]}: promote after it lifts")
    unpaused = state.paused_by is not None
    lifted = state.but(paused_by=None, pause_reason=_step_reason(state), phase=PROGRESSING, updated_at=now)
    if full:
        return _promote_full(lifted)
    skipped = _skip_current_step(lifted)
    restarted = _restart_inconclusive_background(skipped)
    if restarted is lifted and not unpaused:
        raise CommandRefused("nothing_to_promote", _why_nothing_to_promote(state))
    return restarted.but(message="promoted")


def abort(state: RolloutState, reason: str, now: datetime) -> RolloutState:
    """Send all traffic back to A, then drain B (the machine does it, level by level)."""
    if state.phase == COMPLETED:
        raise CommandRefused("rollout_completed", "the rollout is completed: nothing to abort (undo starts a rollout back)")
    if state.phase == ABORTED:
        raise CommandRefused("rollout_aborted", "the rollout is already aborted")
    if state.phase == ABORTING:
        raise CommandRefused("rollout_aborting", "the rollout is already aborting")
    return aborting(state, reason, now)


def retry(state: RolloutState, now: datetime) -> RolloutState:
    """From aborted: the steps again from step 0, with fresh analysis."""
    if state.phase != ABORTED:
        raise CommandRefused("not_aborted", f"only an aborted rollout can be retried; this one is {state.phase}")
    return RolloutState(phase=PROGRESSING, step_index=0, updated_at=now, message="retried: the steps run again from step 0")


def aborting(state: RolloutState, reason: str, now: datetime) -> RolloutState:
    """The state an abort starts from (the operator's or an analysis'): runs stopped, traffic to go to A. A
    break-glass hold (freeze or pin) keeps holding it; an operator's pause does not."""
    step_run = stop(state.step_analysis, "aborted") if state.step_analysis is not None else None
    background = stop(state.background, "aborted") if state.background is not None else None
    paused_by = state.paused_by if state.paused_by in BREAK_GLASS else None
    return state.but(phase=ABORTING, abort_reason=reason, paused_by=paused_by,
                     pause_reason=HOLD_REASONS[paused_by] if paused_by else None, weight=0, step_analysis=step_run,
                     background=background, updated_at=now, message=f"aborting: {reason}")


# --- helpers ---

_HELD = {FREEZE: "the fleet is frozen (break-glass)", PIN: "the model is pinned (break-glass)"}
_HELD_CODES = {FREEZE: "frozen", PIN: "pinned"}


def _refuse_finished(state: RolloutState, verb: str) -> None:
    if state.phase == COMPLETED:
        raise CommandRefused("rollout_completed", f"the rollout is completed: it cannot be {verb}")
    if state.phase == ABORTED:
        raise CommandRefused("rollout_aborted", f"the rollout is aborted: it cannot be {verb} (retry runs it again)")


def _step_reason(state: RolloutState) -> str | None:
    """The pause reason that is the step's own (kept under an operator's hold), if any."""
    return state.pause_reason if state.pause_reason in (PAUSE_STEP, INCONCLUSIVE, DRIFT) else None


def _promote_full(state: RolloutState) -> RolloutState:
    step_run = stop(state.step_analysis, "skipped by promote --full") if state.step_analysis is not None else None
    background = stop(state.background, "skipped by promote --full") if state.background is not None else None
    return state.but(promote_full=True, pause_reason=None, step_analysis=step_run, background=background,
                     message="promoted (full): every remaining step is skipped")


def _skip_current_step(state: RolloutState) -> RolloutState:
    """Past a pause step, or past the step analysis (inconclusive or still running)."""
    run = state.step_analysis
    at_analysis = run is not None and run.step_index == state.step_index and run.phase in (
        INCONCLUSIVE_PHASE, RUNNING, PENDING)
    if state.pause_reason != PAUSE_STEP and not at_analysis:
        return state
    return state.but(step_index=state.step_index + 1, step_started_at=None, step_analysis=None, pause_reason=None)


def _restart_inconclusive_background(state: RolloutState) -> RolloutState:
    if state.background is None or state.background.phase != INCONCLUSIVE_PHASE:
        return state
    # the machine starts a fresh background run on its next reconcile
    return state.but(background=None, pause_reason=None if state.pause_reason == INCONCLUSIVE else state.pause_reason)


def _why_not_resumable(state: RolloutState) -> str:
    if state.pause_reason == PAUSE_STEP:
        return "the rollout waits at a pause step: promote moves past it"
    if state.pause_reason == INCONCLUSIVE:
        return "an analysis was inconclusive: promote skips it, or abort"
    if state.pause_reason == DRIFT:
        return "a step is blocked by engine config drift: fix or replace the drifted engines, or abort"
    return "the rollout is not paused"


def _why_nothing_to_promote(state: RolloutState) -> str:
    if state.pause_reason == DRIFT:
        return ("step {} is blocked by engine config drift: fix or replace the drifted engines, or abort "
                "(promote --full skips every remaining step)").format(state.step_index)
    return (f"step {state.step_index} is neither paused nor analysing: nothing to promote "
            "(promote --full skips every remaining step)")

