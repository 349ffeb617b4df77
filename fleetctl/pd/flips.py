"""Which engines a rebalance flips, and whether a target ratio may be asked for. Pure.

A rebalance keeps the engine count of one class revision and moves engines between roles (mixed, prefill,
decode) one at a time. Each flip takes an engine from a role above its target to a role below it. The engine
is the one whose move costs least right now: one that is not serving first, then the fewest requests in
flight (they must finish before it stops), then the least KV cache held (a prefill engine's cached
prefixes are locality the router loses; a decode engine's are sequences still being decoded), then by name.
The live machine picks each flip when it starts it, so the order follows the load; `preview` shows the
order the fleet as it is now would give.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fleetctl.pd.planner import Ratio

ROLE_ORDER = ("mixed", "prefill", "decode")
KV_WEIGHT = 4.0  # a full KV cache costs about as much as four requests in flight


class TargetRefused(ValueError):
    """A target ratio that may not be asked for; `field` names the option at fault."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class EngineNow:
    """One engine of the revision being rebalanced, as the fleet reports it."""

    name: str
    role: str
    serving: bool  # ready and routable
    in_flight: int = 0  # running + waiting requests
    kv_usage: float = 0.0  # 0..1 of its KV cache in use
    node: str = ""
    deployment: str = ""

    @property
    def cost(self) -> float:
        return (0.0 if self.serving else -1.0) + self.in_flight + KV_WEIGHT * self.kv_usage


@dataclass(frozen=True)
class Flip:
    engine: str
    from_role: str
    to_role: str
    cost: float


def count(ratio: Ratio, role: str) -> int:
    return {"mixed": ratio.mixed, "prefill": ratio.prefill, "decode": ratio.decode}[role]


def with_role(ratio: Ratio, role: str, value: int) -> Ratio:
    counts = {"mixed": ratio.mixed, "prefill": ratio.prefill, "decode": ratio.decode, role: value}
    return Ratio(counts["prefill"], counts["decode"], counts["mixed"])


def check_target(current: Ratio, target: Ratio, floor_prefill: int, floor_decode: int) -> None:
    """TargetRefused (naming `prefill`, `decode` or `mixed`) unless `target` is a ratio the rebalance may
    move to: the same engine count, and either P/D with each role at least its floor, or mixed-only."""
    for role in ROLE_ORDER:
        if count(target, role) < 0:
            raise TargetRefused(f"{role}: must be 0 or more, got {count(target, role)}", role)
    total, wanted = sum(count(current, r) for r in ROLE_ORDER), sum(count(target, r) for r in ROLE_ORDER)
    if wanted != total:
        raise TargetRefused(
            f"prefill: a rebalance keeps the engine count: the revision has {total} ({current.text()}), the target "
            f"asks for {wanted} ({target.text()}); change replicas with `fleetctl deploy`", "prefill")
    if target.prefill == 0 and target.decode == 0:
        return  # mixed-only
    if target.prefill < floor_prefill:
        raise TargetRefused(f"prefill: {target.prefill} is below the floor of {floor_prefill} prefill engine(s); "
                            "to go back to mixed-only, give --prefill 0 --decode 0 --mixed N", "prefill")
    if target.decode < floor_decode:
        raise TargetRefused(f"decode: {target.decode} is below the floor of {floor_decode} decode engine(s)", "decode")


def roles_needing(current: Ratio, target: Ratio) -> tuple[list[str], list[str]]:
    """(roles above their target, roles below it), in ROLE_ORDER."""
    above = [r for r in ROLE_ORDER if count(current, r) > count(target, r)]
    below = [r for r in ROLE_ORDER if count(current, r) < count(target, r)]
    return above, below


def next_flip(engines: Iterable[EngineNow], current: Ratio, target: Ratio, exclude: Iterable[str] = ()) -> Flip | None:
    """The cheapest engine to flip now, or None when `current` is the target (or no engine can move)."""
    above, below = roles_needing(current, target)
    if not above or not below:
        return None
    skip = set(exclude)
    # into P/D from mixed-only: the role with none yet first, so P/D serving can begin as early as possible
    to_role = min(below, key=lambda r: (count(current, r) > 0, ROLE_ORDER.index(r)))
    candidates = [e for e in engines if e.role in above and e.name not in skip]
    if not candidates:
        return None
    best = min(candidates, key=lambda e: (e.cost, ROLE_ORDER.index(e.role), e.name))
    return Flip(best.name, best.role, to_role, best.cost)


def preview(engines: Sequence[EngineNow], current: Ratio, target: Ratio) -> list[Flip]:
    """The flips, in order, if the fleet stayed as it is now."""
    flips: list[Flip] = []
    ratio = current
    while (flip := next_flip(engines, ratio, target, exclude=[f.engine for f in flips])) is not None:
        flips.append(flip)
        ratio = with_role(with_role(ratio, flip.from_role, count(ratio, flip.from_role) - 1),
                          flip.to_role, count(ratio, flip.to_role) + 1)
    return flips
