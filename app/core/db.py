"""The database engine and sessions, built from the settings.

SQLite gets what a multi-process service needs: WAL (readers never block the writer), foreign
keys enforced, and a busy timeout so that the API, the worker and training processes writing
at once wait for each other instead of failing with "database is locked".
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url, text
from sqlalchemy.orm import Session, sessionmaker

from pipeboard.app.core.config import get_settings

SQLITE_BUSY_TIMEOUT_MS = 30_000
# An execution option: the transaction begins IMMEDIATE (app/services/tx.py's begin_read_write).
IMMEDIATE = "pipeboard_sqlite_immediate"


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for `url`; for file SQLite it creates the folder and sets the pragmas."""
    parsed = make_url(url)
    extra_connect_args = kwargs.pop("connect_args", {})
    if parsed.get_backend_name() == "postgresql":
        # An unreachable server fails in seconds instead of hanging start-up or /health.
        connect_args = {"connect_timeout": 10, **extra_connect_args}
        return create_engine(url, pool_pre_ping=True, connect_args=connect_args, **kwargs)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, connect_args=extra_connect_args, **kwargs)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    # FastAPI runs sync endpoints in a thread pool, so connections move between threads.
    connect_args = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, **extra_connect_args}
    engine = create_engine(url, connect_args=connect_args, **kwargs)
    event.listen(engine, "connect", _sqlite_pragmas)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # pysqlite's own transaction handling breaks SAVEPOINT (begin_nested) and delays BEGIN;
    # let SQLAlchemy emit BEGIN itself (the recipe from SQLAlchemy's SQLite dialect docs).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")  # safe with WAL, and far fewer fsyncs
    cursor.close()


def _sqlite_begin(connection: Any) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE" if connection.get_execution_options().get(IMMEDIATE) else "BEGIN")


@lru_cache
def get_engine() -> Engine:
    """The process's engine for the configured database (cached; see `reset_engine`)."""
    return make_engine(get_settings().database_url)


@lru_cache
def get_sessionmaker() -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


def reset_engine() -> None:
    """Forget the cached engine (after the settings changed, or in a forked child)."""
    if get_engine.cache_info().currsize:
        get_engine().dispose()
    get_engine.cache_clear()
    get_sessionmaker.cache_clear()


def get_session() -> Iterator[Session]:
    """One session per request (the FastAPI dependency behind `SessionDep`)."""
    with get_sessionmaker()() as session:
        yield session


def check_database(engine: Engine | None = None) -> None:
    """Raise when the database cannot answer a trivial query."""
    with (engine or get_engine()).connect() as connection:
        connection.execute(text("SELECT 1"))


def with_search_path(url: str, schema: str) -> str:
    """PostgreSQL ``url`` whose connections use ``schema`` first (psycopg's ``options``)."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-csearch_path%3D{schema}"


def private_schema(url: str, prefix: str = "pb") -> tuple[str, Callable[[], None]]:
    """A new schema of its own on the PostgreSQL server at ``url``, for a deployment that must not
    see another's tables (tests, benchmarks beside a live service): the URL that uses it, and a
    function that drops it with everything in it."""
    schema = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = make_engine(url)
    with admin.begin() as connection:
        connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')

    def drop() -> None:
        with admin.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()

    return with_search_path(url, schema), drop
