"""Reachability probes for the database, the broker and the workers.

Shared by `GET /api/v1/health` and `pipeboard up`'s start-up checks. Each probe raises on
failure; `describe_failure` turns the exception into one short line (no traceback, no password).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import func, make_url, select, text
from sqlalchemy.orm import Session

from pipeboard.app.core.config import Settings, scheme_of
from pipeboard.app.core.db import make_engine


def check_database_url(url: str, timeout_s: float) -> None:
    """Connect to `url` and run a trivial query (a fresh engine, disposed afterwards)."""
    kwargs: dict[str, Any] = {}
    if make_url(url).get_backend_name() == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": max(1, int(timeout_s))}
    engine = make_engine(url, **kwargs)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    finally:
        engine.dispose()


def check_broker(settings: Settings, timeout_s: float) -> None:
    """Reach the broker itself: Redis answers PING, the SQLite broker's file opens."""
    scheme = scheme_of(settings.broker_url)
    if scheme in ("redis", "rediss"):
        import redis

        client = redis.Redis.from_url(settings.broker_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        try:
            client.ping()
        finally:
            client.close()
    elif scheme.startswith("sqla"):
        check_database_url(settings.broker_url.split("+", 1)[1], timeout_s)
    else:
        from pipeboard.app.worker import celery_app

        with celery_app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=timeout_s)


def count_workers(settings: Settings, session: Session, timeout_s: float) -> int:
    """Live Celery workers: a control ping where the broker broadcasts, else fresh heartbeats."""
    from pipeboard.app.worker import broker_supports_broadcast, celery_app

    if broker_supports_broadcast(settings.broker_url):
        return len(celery_app.control.ping(timeout=timeout_s) or [])
    from pipeboard.app.models import WorkerHeartbeat, utcnow

    fresh_since = utcnow() - timedelta(seconds=settings.stale_after_seconds)
    return int(session.scalar(select(func.count()).where(WorkerHeartbeat.seen_at >= fresh_since)) or 0)


def describe_failure(exc: BaseException) -> str:
    """The first line of an exception's message, without the SQL or driver noise after it."""
    message = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    first = message[0] if message else type(exc).__name__
    return f"unreachable: {first[:200]}"


def redacted(url: str) -> str:
    """`url` with any password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1] if "@" in url else url
