"""`/jobs/{id}/events`: the live Server-Sent Events stream of one job; `/steps`, its per-step summaries;
`/detail`, which steps have their full action timeline (GET) and asking the running job to record its next
steps' in full (POST)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from pipeboard.app.api.common import AUTH_RESPONSES, NOT_FOUND, JobId, ServiceRoute
from pipeboard.app.api import ownership
from pipeboard.app.api.deps import SessionDep
from pipeboard.app.api.security import ReadAccess, WriteAccess
from pipeboard.app.services import events as job_log
from pipeboard.app.services import rundata, storage, stream
from pipeboard.app.services.run_sink import DETAIL_REQUEST
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


@router.get(
    "/{job_id}/steps",
    summary="Every step's summary",
    description=(
        "Columnar, one entry per step: `step`, `wall_s`, `attempt`, `loss`, `samples_per_s`, and `stages`: per step one "
        "row per stage with the values named by `columns` (busy, idle, bubble and transfer seconds, memory bytes, the "
        "median F, B, BI and W seconds). Evenly thinned past `limit`. `detail_steps`: the [first, last] step ranges "
        "whose full action timeline was recorded (the Gantt and the trace can show them)."
    ),
    responses=NOT_FOUND,
)
def job_steps(
    job_id: JobId,
    session: SessionDep,
    principal: ReadAccess,
    step_from: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    step_to: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 5000,
) -> dict[str, Any]:
    ownership.job_for(session, principal, job_id)
    return rundata.step_summaries(session, job_id, step_from=step_from, step_to=step_to, limit=limit)


@router.get(
    "/{job_id}/detail",
    summary="Which steps have full actions",
    description=(
        "`detail_steps`: the [first, last] step ranges whose full action timeline was recorded, and `last_step`: the "
        "newest step with a summary (null before the first). What `/steps` says of them, without reading any summary: "
        "its cost does not grow with the job's steps."
    ),
    responses=NOT_FOUND,
)
def job_detail_windows(job_id: JobId, session: SessionDep, principal: ReadAccess) -> dict[str, Any]:
    ownership.job_for(session, principal, job_id)
    return {"job_id": job_id, "detail_steps": rundata.detail_windows(session, job_id), "last_step": rundata.last_step(session, job_id)}


class DetailRequest(BaseModel):
    """How many of a running job's next steps to record in full."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"steps": 20}]})
    steps: int = Field(20, ge=1, le=1000, description="How many steps to record.")


@router.post(
    "/{job_id}/detail",
    status_code=202,
    summary="Record the next steps in full",
    description=(
        "Asks the running job to record the full action timeline of its next `steps` steps. The request goes into the "
        "job's event log (a `detail_request` event); the run reads the log at each report it writes (every half second), "
        "so it starts within a step or two. 409 when the job is not running."
    ),
    responses=NOT_FOUND,
)
def request_detail(
    job_id: JobId,
    session: SessionDep,
    principal: WriteAccess,
    body: Annotated[DetailRequest, Body()] = DetailRequest(),
) -> dict[str, Any]:
    steps = body.steps
    job = ownership.job_for(session, principal, job_id)
    if job.status.value != "running":
        raise ServiceError(f"job {job_id} is {job.status.value}: only a running job can record detail", status=409, field="job_id")
    published = job_log.append(session, job_id, [(DETAIL_REQUEST, {"steps": steps})])
    return {"job_id": job_id, "steps": steps, "seq": published[0]["seq"]}


@router.get(
    "/{job_id}/storage",
    summary="A job's disk use",
    description=(
        "Rows and bytes (the stored values, without index overhead) per table: `timeline_events` (the action "
        "timeline, kept in windows), `metric_points` (one per step, with its summary), `job_events` (the event log); "
        "`detail_steps`: how many steps keep their full actions. `pipeboard storage prune` reclaims finished jobs' detail."
    ),
    responses=NOT_FOUND,
)
def job_storage(job_id: JobId, session: SessionDep, principal: ReadAccess) -> dict[str, Any]:
    ownership.job_for(session, principal, job_id)
    return storage.usage(session, job_id)
