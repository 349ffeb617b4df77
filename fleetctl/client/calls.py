"""The call table: every controller route once, gathered from its families (calls_*.py). Both clients
inherit it, so they have the same methods with the same arguments."""

from __future__ import annotations

from typing import Any

from fleetctl.client.calls_admin import AdminCalls
from fleetctl.client.calls_canary import CanaryCalls
from fleetctl.client.calls_fleet import FleetCalls
from fleetctl.client.calls_pd import PdCalls
from fleetctl.client.calls_policy import PolicyCalls
from fleetctl.client.endpoint import Endpoint


class ControllerCalls(FleetCalls, PolicyCalls, CanaryCalls, AdminCalls, PdCalls):
    """The call table: each controller route once. Both clients inherit it; `endpoints()` lists it.

    The builders take no `self`: `endpoint` turns each into an Endpoint, which binds to the client."""

    @classmethod
    def endpoints(cls) -> list[Endpoint[Any, Any]]:
        return [value for klass in cls.__mro__ for value in vars(klass).values() if isinstance(value, Endpoint)]
