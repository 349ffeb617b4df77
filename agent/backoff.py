"""Retry delays: exponential backoff with full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter").

    delay(attempt) = uniform(0, min(cap, base * 2 ** attempt))

Full jitter spreads a crowd of clients that failed together (every agent of a fleet whose controller just
restarted) over the whole window instead of letting them retry in lockstep. The random source is injected
so tests can pin it; the function is otherwise pure.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

Uniform = Callable[[float, float], float]


@dataclass(frozen=True)
class Backoff:
    """A backoff policy: `base` and `cap` in seconds."""

    base: float = 0.5
    cap: float = 30.0

    def window(self, attempt: int) -> float:
        """The upper bound of the delay before retry number `attempt` (0 for the first retry)."""
        # 2 ** attempt grows without bound; past 64 doublings every window is the cap anyway.
        return min(self.cap, self.base * 2 ** min(attempt, 64))

    def delay(self, attempt: int, uniform: Uniform = random.uniform) -> float:
        """Seconds to wait before retry number `attempt`: full jitter over the window."""
        return uniform(0.0, self.window(attempt))


# Controller reconnects: many agents, one controller; spread them. The cap bounds how long a node takes to
# come back after a long outage (and to upload its direct actions): 1,000 agents spread over 8 s knock at
# ~125/s, below the steady heartbeat load the controller carries (docs/benchmarks.md, controller scale).
CONTROLLER_BACKOFF = Backoff(base=0.5, cap=8.0)
# Engine crash restarts: one process; give a crash loop room without waiting long after a one-off crash.
RESTART_BACKOFF = Backoff(base=1.0, cap=60.0)
