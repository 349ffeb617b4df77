"""Which replica class serves a request: the model's traffic weights decide, a pin overrides, and a class
whose context window cannot hold the request is refused with a reason (never silently truncated).

Routing between classes is a correctness surface (a load-balancing change once sent 16% of requests to
differently configured servers), so both functions are pure and deterministic: the caller passes the random
draw in, and the same inputs always pick the same class.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol

from fleetctl.flag_catalog import value_of
from fleetctl.gateway.errors import InvalidRoute, NoRoute

PIN_HEADER = "x-fleet-pin-class"


class HasContextWindow(Protocol):
    """What `fits` needs of a class spec (fleetctl.replica_class.ReplicaClassSpec has it)."""

    max_model_len: int


def choose_class(traffic_weights: Mapping[str, float], pin: str | None, rng_value: float) -> str:
    """The class for one request.

    `traffic_weights`: class_ref -> weight (any non-negative scale) for every class that serves the model,
    zero-weight classes included so they can be pinned. `pin`: the x-fleet-pin-class header, or None.
    `rng_value`: a uniform draw in [0, 1). Classes are laid out in sorted order of class_ref and the draw
    picks the one whose interval of cumulative weight fractions contains rng_value.
    """
    if pin is not None:
        if pin not in traffic_weights:
            raise InvalidRoute(f"pinned class {pin!r} does not serve this model", param=PIN_HEADER)
        return pin
    if not 0.0 <= rng_value < 1.0:
        raise ValueError(f"rng_value must be in [0, 1), got {rng_value}")
    weighted = [(ref, w) for ref, w in sorted(traffic_weights.items()) if w > 0]
    if not weighted:
        raise NoRoute("the model has no class with traffic weight")
    total = sum(w for _, w in weighted)
    cumulative = 0.0
    for ref, weight in weighted:
        cumulative += weight
        if rng_value < cumulative / total:  # fractions, not rng_value * total: tiny weights must not underflow
            return ref
    return weighted[-1][0]  # rounding at the top end of the interval


def fleet_pin(flags: Mapping[str, Any], model: str, classes: Collection[str]) -> str | None:
    """The class revision a break-glass pin (`pin:MODEL` flag) sends all of the model's traffic to, over
    its weights and drills; None without a pin, or when the pinned revision no longer serves the model
    (then the weights decide: serving something beats refusing everything)."""
    ref = value_of(flags, "pin", model)
    return ref if isinstance(ref, str) and ref in classes else None


def fits(request_tokens: int, max_tokens: int | None, class_spec: HasContextWindow) -> str | None:
    """None when prompt + max_tokens fit the class's context window, else the reason it does not.

    Without max_tokens the prompt must leave room for at least one generated token.
    """
    window = class_spec.max_model_len
    if max_tokens is None:
        if request_tokens < window:
            return None
        return f"prompt of {request_tokens} tokens leaves no room to generate in a context window of {window} tokens"
    if request_tokens + max_tokens <= window:
        return None
    return (
        f"prompt of {request_tokens} tokens + max_tokens {max_tokens} = {request_tokens + max_tokens} "
        f"exceeds the context window of {window} tokens"
    )
