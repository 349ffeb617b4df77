"""Deployments: a named, scaled use of one class revision in one role (mixed | prefill | decode),
placed on nodes whose labels match. The reconciler turns them into per-node assignments."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller.classes import resolve_ref
from fleetctl.controller.models import Deployment
from fleetctl.controller.schemas import DeploymentSet
from fleetctl.controller.versions import check_version
from fleetctl.errors import NotFound, ValidationFailed

CREATED, UPDATED, UNCHANGED = "created", "updated", "unchanged"


def set_deployment(session: Session, name: str, body: DeploymentSet, actor: str, now: datetime,
                   expected_version: int | None = None) -> tuple[Deployment, str]:
    """Create or update; returns (row, created|updated|unchanged). The class must exist and serve `model`;
    with `expected_version` (If-Match) the stored deployment must be at that version."""
    revision = resolve_ref(session, body.class_ref)
    model = body.model if body.model is not None else revision.spec["model"]
    if model != revision.spec["model"]:
        raise ValidationFailed(
            f"model: {revision.ref} serves {revision.spec['model']!r}, not {model!r}", field="model",
        )
    desired = {"model": model, "class_ref": revision.ref, "role": body.role, "replicas": body.replicas,
               "placement": dict(body.placement)}
    row = session.get(Deployment, name)
    check_version(row, expected_version, f"deployment {name!r}")
    if row is None:
        row = Deployment(name=name, updated_at=now, updated_by=actor, **desired)
        session.add(row)
        session.flush()  # assigns the version
        return row, CREATED
    if all(getattr(row, key) == value for key, value in desired.items()):
        return row, UNCHANGED
    for key, value in desired.items():
        setattr(row, key, value)
    row.updated_at, row.updated_by = now, actor
    session.flush()  # advances the version (or finds a concurrent change: StaleDataError)
    return row, UPDATED


def get_deployment(session: Session, name: str) -> Deployment:
    row = session.get(Deployment, name)
    if row is None:
        raise NotFound(f"no deployment {name!r}", field="name")
    return row


def list_deployments(session: Session) -> list[Deployment]:
    return list(session.execute(select(Deployment).order_by(Deployment.name)).scalars())


def delete_deployment(session: Session, name: str, expected_version: int | None = None) -> None:
    """Its engines are drained by the next reconcile, not killed."""
    row = get_deployment(session, name)
    check_version(row, expected_version, f"deployment {name!r}")
    session.delete(row)


def deployment_view(row: Deployment) -> dict[str, Any]:
    return {
        "name": row.name, "model": row.model, "class_ref": row.class_ref, "role": row.role,
        "replicas": row.replicas, "placement": row.placement, "updated_at": row.updated_at.isoformat(),
        "updated_by": row.updated_by, "version": row.version,
    }
