"""`/workers`: the live Celery workers, each with its GPUs, free or held by a job."""

from __future__ import annotations

from fastapi import APIRouter

from pipeboard.app.api.common import AUTH_RESPONSES, Limit, Offset, ServiceRoute
from pipeboard.app.api.deps import SessionDep
from pipeboard.app.api.security import ReadAccess
from pipeboard.app.schemas import Page
from pipeboard.app.schemas.workers import WorkerPublic
from pipeboard.app.services.placement import workers_view

router = APIRouter(prefix="/workers", tags=["workers"], route_class=ServiceRoute, responses=AUTH_RESPONSES)


@router.get(
    "",
    response_model=Page[WorkerPublic],
    summary="List live workers and their GPUs",
    description=(
        "Every worker whose heartbeat is fresh, by name, with the GPUs it reported (as its torch sees them: "
        "name, memory, compute capability, CUDA and driver versions) and, for each, the job whose attempt "
        "holds it (`job_id`), or null when it is free. A cuda job runs only on a worker with enough free GPUs; "
        "one that none has waits, its reason on the job (`waiting: needs 4 GPUs, largest free block 2`)."
    ),
)
def list_workers(_: ReadAccess, session: SessionDep, offset: Offset = 0, limit: Limit = 100) -> Page[WorkerPublic]:
    rows = workers_view(session)
    return Page(data=[WorkerPublic(**r) for r in rows[offset:offset + limit]], count=len(rows))
