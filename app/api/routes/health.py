"""`GET /api/v1/health`: can the service reach its database and broker, how many workers live and
the GPUs each reports."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from sqlalchemy import text

from pipeboard.app.api.deps import SessionDep, SettingsDep
from pipeboard.app.core.config import VERSION
from pipeboard.app.services.placement import workers_view
from pipeboard.app.services.probes import check_broker, count_workers, describe_failure

router = APIRouter(tags=["health"])


@router.get("/health", summary="Database, broker and worker status")
def health(session: SessionDep, settings: SettingsDep, response: Response) -> dict[str, Any]:
    """`{"database": "ok", "broker": "ok", "workers": N, "worker_devices": [...], "version": ...}`.

    `worker_devices`: each live worker (fresh heartbeat) with the GPUs it reports, `[]` for none
    (`GET /api/v1/workers` says more: which job holds each GPU).

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
    workers, worker_devices = 0, []
    if database == "ok":
        try:
            worker_devices = [{"worker": w["worker"], "host": w["host"],
                               "devices": [{k: v for k, v in d.items() if k != "job_id"} for d in w["devices"]]}
                              for w in workers_view(session)]
        except Exception:  # the heartbeat table not migrated yet
            session.rollback()
    if broker == "ok":
        try:
            workers = count_workers(settings, session, timeout_s)
        except Exception:  # e.g. the heartbeat table not migrated yet: no live worker known
            session.rollback()
    if database != "ok" or broker != "ok":
        response.status_code = 503
    return {"database": database, "broker": broker, "workers": workers, "worker_devices": worker_devices,
            "version": VERSION}
