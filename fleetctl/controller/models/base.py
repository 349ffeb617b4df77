"""The schema's base: the declarative base, UTC timestamps, optimistic versioning and name lengths."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, DateTime, Integer, TypeDecorator
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column


class UTCDateTime(TypeDecorator[datetime]):
    """timestamptz on PostgreSQL; on SQLite (no time zones) values come back naive and are read as UTC."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime: use datetime.now(timezone.utc)")
        return value.astimezone(timezone.utc) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


class Versioned:
    """An object operators change: `version` advances with every change, and an UPDATE or DELETE of a row
    whose version moved since it was read matches no row (StaleDataError, the API's 409). So a concurrent
    writer never overwrites a change it did not see; the API serves the version as the ETag."""

    version: Mapped[int] = mapped_column(Integer, default=1)

    @declared_attr.directive
    def __mapper_args__(cls) -> dict[str, Any]:
        return {"version_id_col": cls.__table__.c.version}


NAME = 63  # DNS-label length: node, engine, class, deployment and token names
FLAG_KEY = 264  # a flag's key: its name, ':' and a model name (at most 200)
REF = 80  # NAME@rN
