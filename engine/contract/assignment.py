"""`EngineAssignment`: one engine the controller wants on a node, as the heartbeat reply carries it.

The controller answers every heartbeat with the node's whole assignment (a list of these) and its
generation; the agent applies it. Unknown fields are ignored, so an older agent can read a newer
controller's reply during an upgrade.

`planted_fault` is set only while a `fleetctl drill plant` is active for this engine: the agent then runs
the engine with engine.contract.faults.FAULT_ENV set to it (and restarts it when the field changes), but
never reports the variable, so the engine's reported configuration stays clean.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from engine.contract.bounds import SafeJsonObject
from engine.contract.engine_state import Role
from engine.contract.faults import Fault
from engine.contract.fields import ClassRef, EngineName, ModelName


class EngineAssignment(BaseModel):
    """One engine the controller wants on this node. `spec` is the replica class (ReplicaClassSpec JSON)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: EngineName = Field(description="stable engine name, <deployment>-<index>")
    model: ModelName = Field(description="the name clients ask for")
    class_ref: ClassRef = Field(description="the replica class revision, NAME@rN")
    spec: SafeJsonObject = Field(description="the replica class's fields")
    role: Role = "mixed"
    drain: bool = Field(default=False, description="stop taking requests, finish in-flight ones, then exit")
    planted_fault: Fault | None = Field(
        default=None, description="a canary drill's hidden numeric fault (engine.contract.faults): the engine "
                                  "runs with it while the drill lasts; None: a clean engine")
