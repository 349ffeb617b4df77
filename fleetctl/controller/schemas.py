"""Request bodies of the operator API. Every mutating body may carry `reason` (the audit log's why; the
X-Fleet-Reason header is the alternative). Validation is complete before anything is stored."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from engine.contract.bounds import Finite, FreeText, Int64, SafeStr
from fleetctl.replica_class import NAME_PATTERN, ReplicaClassSpec

LABEL_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$")


def _name(value: str) -> str:
    if not NAME_PATTERN.match(value):
        raise ValueError("must be 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit")
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


def _labels(value: dict[str, str]) -> dict[str, str]:
    for key, label in value.items():
        if not LABEL_KEY.match(key):
            raise ValueError(f"label key {key!r} must be 1-63 letters, digits, '.', '_', '/' or '-'")
        if len(label) > 63:
            raise ValueError(f"label {key!r}: value longer than 63 characters")
    return value


Name = Annotated[str, Field(max_length=63), AfterValidator(_name)]
NonBlank = Annotated[SafeStr, Field(min_length=1, max_length=500), AfterValidator(_not_blank)]
LabelMap = Annotated[dict[str, SafeStr], Field(max_length=64), AfterValidator(_labels)]
Reason = Annotated[FreeText | None, Field(description="why (recorded in the audit log)")]
ClassRef = Annotated[SafeStr, Field(min_length=1, max_length=80, description="a class revision, NAME@rN"), AfterValidator(_not_blank)]
TokenRole = Literal["viewer", "operator", "admin", "agent"]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Reason = None


class KVFlush(Body):
    class_name: Name | None = Field(default=None, description="the class whose tiers to flush; omitted: every class's")
    tier: Literal["dram", "disk"] | None = Field(default=None, description="one tier; omitted: both")


class ClassApply(Body):
    name: Name
    spec: ReplicaClassSpec


def _http_url(value: str) -> str:
    if not re.match(r"^https?://[^/\s]+(/\S*)?$", value):
        raise ValueError("must be an http(s):// base URL, e.g. http://10.0.0.5:8000")
    return value.rstrip("/")


def _zmq_endpoint(value: str) -> str:
    if not re.match(r"^tcp://[^/\s:]+:[0-9]{1,5}$", value):
        raise ValueError("must be a ZMQ endpoint, tcp://HOST:PORT")
    return value


class EngineAdopt(Body):
    url: Annotated[SafeStr, Field(max_length=500, description="the engine's base URL, http(s)://HOST:PORT"),
                   AfterValidator(_http_url)]
    model: NonBlank = Field(description="the model name it serves (its /v1/models must list it)")
    class_ref: ClassRef = Field(description="the class revision it runs, NAME@rN: what it reports is checked "
                                "against it")
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    kv_events_endpoint: Annotated[SafeStr | None, Field(max_length=500, description="its KV events publisher, "
                                  "tcp://HOST:PORT (the replay socket is the next port); none: no prefix routing"),
                                  AfterValidator(lambda v: v if v is None else _zmq_endpoint(v))] = None
    name: Name | None = Field(default=None, description="the engine's name in the fleet; default "
                              "adopted-HOST-PORT")


class DeploymentSet(Body):
    class_ref: ClassRef = Field(description="NAME@rN, or NAME for its latest revision (stored resolved)")
    model: Annotated[NonBlank, Field(max_length=200)] | None = Field(
        default=None, description="default: the class's model; must equal it")
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    replicas: int = Field(ge=0, le=10_000)
    placement: LabelMap = Field(default_factory=dict, description="node labels that must all match")


class TrafficSet(Body):
    weights: dict[ClassRef, Finite] = Field(
        min_length=1, max_length=1000,
        description="class revision NAME@rN -> weight (>= 0, relative; some positive); checked by traffic_guard",
    )
    allow_correctness_change: bool = Field(
        default=False, description="store a split over revisions whose correctness fields differ (audited)")


class FlagSet(Body):
    value: bool | Int64 | Finite | Annotated[SafeStr, Field(max_length=1000)] = Field(
        description="the flag's value, of its type in the catalog (a boolean, or a number in its range)")
    ttl_s: Annotated[float, Field(gt=0, le=30 * 24 * 3600)] | None = Field(
        default=None, description="seconds until the override expires and the flag reverts to its default; "
                                  "none: until unset. Setting it again renews it")


TTL = Annotated[float, Field(gt=0, le=30 * 24 * 3600)] | None


class BreakGlass(Body):
    ttl_s: TTL = Field(default=None, description="seconds until the hold lifts by itself; none: until lifted")


class BreakGlassPin(BreakGlass):
    class_ref: ClassRef = Field(description="NAME@rN: the known-good revision all of the model's traffic goes to")


class BreakGlassShed(BreakGlass):
    fraction: Annotated[float, Field(ge=0, le=1)] = Field(description="the fraction of the model's requests "
                                                          "gateways answer 429 at once (0 stops shedding)")


class BreakGlassKill(BreakGlass):
    model: Name | None = Field(default=None, description="the model, for a per-model flag")


class Reconcile(Body):
    adopt: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list, max_length=1000,
                                                     description="direct actions desired state takes over")
    revert: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list, max_length=1000,
                                                      description="direct actions the nodes undo")


class TokenCreate(Body):
    name: Name
    role: TokenRole
