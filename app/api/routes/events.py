"""`/jobs/{id}/events`: the live Server-Sent Events stream of one job."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse

from pipeboard.app.api.common import AUTH_RESPONSES, NOT_FOUND, JobId, ServiceRoute
from pipeboard.app.api import ownership
from pipeboard.app.api.deps import SessionDep
from pipeboard.app.api.security import ReadAccess
from pipeboard.app.services import stream
from pipeboard.app.services.errors import ServiceError

MAX_EVENT_ID = 2**31 - 1
# 1 to 10 ASCII digits: str.isdigit() is true for "²" and other Unicode digits int() refuses,
# and an unbounded run of digits costs int() time; a 10-digit value may still be past the limit.
EVENT_ID = re.compile(r"[0-9]{1,10}")
BAD_EVENT_ID = f"Last-Event-ID: must be a whole number from 0 to {MAX_EVENT_ID} in ASCII digits"


def parse_last_event_id(header: str) -> int:
    """The id an EventSource resumes after; a 400 naming the header for anything else."""
    text = header.strip(" \t")
    if not EVENT_ID.fullmatch(text) or int(text) > MAX_EVENT_ID:
        raise ServiceError(BAD_EVENT_ID, status=400, field="Last-Event-ID")
    return int(text)


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
    session: SessionDep,
    principal: ReadAccess,
    last_event_id: Annotated[int | None, Query(ge=0, le=2**31 - 1, description="Resume after this id.")] = None,
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID", include_in_schema=False)] = None,
) -> StreamingResponse:
    resume = last_event_id
    if resume is None and last_event_id_header is not None:
        resume = parse_last_event_id(last_event_id_header)
    ownership.job_for(session, principal, job_id)  # another user's job: 404, as a missing one
    session.commit()  # end the read here: the stream reads with sessions of its own for as long as it runs
    return StreamingResponse(
        stream.stream(job_id, resume or 0),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
