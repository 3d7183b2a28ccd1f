"""`GET /api/v1/health`: can the service reach its database and broker, and how many workers live."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from sqlalchemy import text

from pipeboard.app.api.deps import SessionDep, SettingsDep
from pipeboard.app.core.config import VERSION
from pipeboard.app.services.probes import check_broker, count_workers, describe_failure

router = APIRouter(tags=["health"])


@router.get("/health", summary="Database, broker and worker status")
def health(session: SessionDep, settings: SettingsDep, response: Response) -> dict[str, Any]:
    """`{"database": "ok", "broker": "ok", "workers": N, "version": ...}`.

    A part that cannot be reached reads `"unreachable: <reason>"` and the status is 503, so
    load balancers and `docker compose` health checks see it; no workers is not an error.
    """
    timeout_s = settings.health_timeout_seconds
    try:
        session.execute(text("SELECT 1"))
        database = "ok"
    except Exception as exc:
        session.rollback()
        database = describe_failure(exc)
    try:
        check_broker(settings, timeout_s)
        broker = "ok"
    except Exception as exc:
        broker = describe_failure(exc)
    workers = 0
    if broker == "ok":
        try:
            workers = count_workers(settings, session, timeout_s)
        except Exception:  # e.g. the heartbeat table not migrated yet: no live worker known
            session.rollback()
    if database != "ok" or broker != "ok":
        response.status_code = 503
    return {"database": database, "broker": broker, "workers": workers, "version": VERSION}
