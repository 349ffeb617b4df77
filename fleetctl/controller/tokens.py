"""API tokens: create (the plaintext is shown once), list, revoke; and the bootstrap admin token."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fleetctl.controller.auth import ADMIN, hash_token, new_token
from fleetctl.controller.db import Store
from fleetctl.controller.models import ApiToken
from fleetctl.controller.paths import bootstrap_token_path
from fleetctl.errors import Conflict, NotFound

log = logging.getLogger(__name__)

BOOTSTRAP_NAME = "bootstrap"


def create_token(session: Session, name: str, role: str, actor: str, now: datetime) -> tuple[ApiToken, str]:
    if session.get(ApiToken, name) is not None:
        raise Conflict(f"a token named {name!r} exists (revoked tokens keep their names)", field="name")
    token = new_token()
    row = ApiToken(name=name, role=role, token_sha256=hash_token(token), created_at=now, created_by=actor)
    session.add(row)
    session.flush()
    return row, token


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.execute(select(ApiToken).order_by(ApiToken.name)).scalars())


@dataclass(frozen=True)
class Revocation:
    """What `revoke_token` did, and the guards `force` overrode (recorded in the audit event)."""

    revoked: bool  # False: it already was
    overridden: tuple[str, ...] = ()  # LAST_ADMIN and/or OWN_TOKEN


LAST_ADMIN, OWN_TOKEN = "last_admin", "own_token"


def revoke_token(session: Session, name: str, now: datetime, requester: str, force: bool = False) -> Revocation:
    """Revoke `name`. Refused (409) unless `force` when it is the last active stored admin token (nobody
    could administer the fleet afterwards) or the token making the request (the caller locks itself out)."""
    row = session.get(ApiToken, name)
    if row is None:
        raise NotFound(f"no token named {name!r}", field="name")
    if row.revoked_at is not None:
        return Revocation(False)
    guards = _lockout_guards(session, row, requester)
    if guards and not force:
        raise Conflict(_LOCKOUT_MESSAGES[guards[0]].format(name=name) + "; pass --force (force=true) to revoke it anyway",
                       code=guards[0], field="name")
    row.revoked_at = now
    return Revocation(True, guards)


_LOCKOUT_MESSAGES = {
    LAST_ADMIN: "token {name!r} is the last active admin token: revoking it leaves nobody able to administer the fleet",
    OWN_TOKEN: "token {name!r} is the token making this request: revoking it locks you out",
}


def _lockout_guards(session: Session, row: ApiToken, requester: str) -> tuple[str, ...]:
    guards = []
    if row.role == ADMIN:
        admins = session.execute(select(func.count()).select_from(ApiToken).where(
            ApiToken.role == ADMIN, ApiToken.revoked_at.is_(None), ApiToken.name != row.name)).scalar_one()
        if admins == 0:
            guards.append(LAST_ADMIN)
    if row.name == requester:
        guards.append(OWN_TOKEN)
    return tuple(guards)


def token_view(row: ApiToken) -> dict[str, Any]:
    return {
        "name": row.name,
        "role": row.role,
        "created_at": row.created_at.isoformat(),
        "created_by": row.created_by,
        "revoked_at": row.revoked_at.isoformat() if row.revoked_at else None,
    }


def ensure_bootstrap_token(store: Store, state_dir: Path, now: datetime) -> Path | None:
    """On first start, create the admin token 'bootstrap' and write it to STATE_DIR/bootstrap-token (0600).
    Returns the file path when a token was created by this call."""
    with store.session() as session:
        if session.get(ApiToken, BOOTSTRAP_NAME) is not None:
            return None
    path = bootstrap_token_path(state_dir)
    try:
        with store.session() as session:
            _, token = create_token(session, BOOTSTRAP_NAME, ADMIN, "controller", now)
            _write_secret(path, token)
    except (IntegrityError, Conflict):
        return None  # another controller replica created it first
    log.info("created the bootstrap admin token; it is in %s", path)
    return path


def _write_secret(path: Path, secret: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
