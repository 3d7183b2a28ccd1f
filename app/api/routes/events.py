"""`/jobs/{id}/events`: the live Server-Sent Events stream of one job."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse

from pipeboard.app.api.common import AUTH_RESPONSES, NOT_FOUND, JobId, ServiceRoute
from pipeboard.app.api.security import ReadAccess
from pipeboard.app.services import stream
from pipeboard.app.services.errors import NotFound, ServiceError

router = APIRouter(prefix="/jobs", tags=["jobs"], route_class=ServiceRoute, responses=AUTH_RESPONSES)


@router.get(
    "/{job_id}/events",
    summary="Live job events (SSE)",
    description=(
        "`text/event-stream` of the job's log: events `status`, `progress`, `timeline` (a batch of measured "
        "events as [worker, stage, replica, microbatch, kind, start, end, step] rows), `metrics`, `summary`, "
        "and finally `end`, after which the stream closes. Each message's `id` is its sequence number: "
        "reconnect with `Last-Event-ID` (or `?last_event_id=`) to resume without loss or repeats."
    ),
    responses={**NOT_FOUND, 200: {"content": {"text/event-stream": {}}, "description": "The event stream."}},
    response_class=StreamingResponse,
)
def job_events(
    job_id: JobId,
    _: ReadAccess,
    last_event_id: Annotated[int | None, Query(ge=0, le=2**31 - 1, description="Resume after this id.")] = None,
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID", include_in_schema=False)] = None,
) -> StreamingResponse:
    resume = last_event_id
    if resume is None and last_event_id_header:
        if not last_event_id_header.strip().isdigit():
            raise ServiceError("Last-Event-ID: must be a non-negative integer", status=400, field="Last-Event-ID")
        resume = int(last_event_id_header.strip())
        if resume > 2**31 - 1:
            raise ServiceError("Last-Event-ID: too large", status=400, field="Last-Event-ID")
    if not stream.job_exists(job_id):
        raise NotFound("job", job_id)
    return StreamingResponse(
        stream.stream(job_id, resume or 0),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
