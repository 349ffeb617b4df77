"""Alembic environment. The controller passes its open connection in `config.attributes["connection"]`;
run by hand, the URL comes from FLEET_DB_URL or alembic.ini.

On PostgreSQL a transaction-scoped advisory lock (per database and schema) serialises concurrent
migrations, so several controller replicas can start at once.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, text

from fleetctl.controller.db import make_engine
from fleetctl.controller.models import Base

config = context.config
if config.config_file_name is not None and not config.attributes.get("connection"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(hashtext('fleetctl-migrate:' || current_database() || '.' || current_schema()))"))
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(os.environ.get("FLEET_DB_URL") or config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        _run(connection)
        connection.commit()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
