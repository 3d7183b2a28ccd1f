"""Alembic environment: the URL comes from pipeboard's settings, the target from pipeboard.app.models.

A caller may hand over an open connection in `config.attributes["connection"]` (tests do, to
migrate inside their own schema) or a URL with `config.set_main_option("sqlalchemy.url", ...)`.
`render_as_batch=True` lets the same revisions alter tables on SQLite, which has no ALTER.
"""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any

from alembic import context

from pipeboard.app.core.config import get_settings
from pipeboard.app.core.db import make_engine
from pipeboard.app.models import Base, UTCDateTime

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    # Tables that are not ours (kombu's or Celery's, when they share the database) are left alone.
    if type_ == "table" and reflected and compare_to is None:
        return False
    return True


def render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    # Revisions spell our UTC timestamp as the plain column type it is stored as.
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def database_url() -> str:
    return config.get_main_option("sqlalchemy.url") or get_settings().database_url


def run_migrations_offline() -> None:
    context.configure(
        url=database_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=True,
        include_object=include_object,
        render_item=render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_with_connection(connection: Any) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        include_object=include_object,
        render_item=render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_with_connection(connection)
        return
    engine = make_engine(database_url())
    try:
        with engine.connect() as connection:
            run_with_connection(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
