"""fleetctl's exit codes: a documented, stable contract for scripts (docs/control-plane.md)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # done
    ERROR = 1  # anything else: a server error, a drain that did not finish in time, an aborted prompt
    USAGE = 2  # bad command line or bad input: unknown option, unreadable file, invalid field (422), too large (413)
    NOT_FOUND = 3  # the named node, engine, class, deployment or token does not exist (404)
    AUTH = 4  # token missing, unknown or revoked (401), or its role is not enough (403)
    REFUSED = 5  # conflict or refused by the current state (409, other 4xx)
    UNAVAILABLE = 6  # controller unreachable, timed out, or its database is down (503)
    DIFFERS = 7  # `class diff`: a correctness-relevant field differs (outputs may change); also live drift found
    ROLLOUT_ABORTED = 8  # `rollout watch` / `rollout status --wait`: the rollout ended aborted (traffic back on A)
    ROLLOUT_PAUSED = 9  # `rollout watch --exit-on-pause`: the rollout paused and waits for an operator
    REBALANCE_STOPPED = 10  # `pd rebalance --apply`: it stopped before the target (an SLO worsened, or `pd stop`)
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT) stopped a command that waits (`traffic shift`, `rollout watch`); it says where it left things
