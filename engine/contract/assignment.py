"""`EngineAssignment`: one engine the controller wants on a node, as the heartbeat reply carries it.

The controller answers every heartbeat with the node's whole assignment (a list of these) and its
generation; the agent applies it. Unknown fields are ignored, so an older agent can read a newer
controller's reply during an upgrade.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from engine.contract.bounds import SafeJsonObject
from engine.contract.engine_state import Role
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
