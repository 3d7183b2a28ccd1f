"""`/jobs`: submit, list, get, cancel, retry; and a job's run data (timeline, metrics, trace)."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response

from pipeboard.app.api.deps import SessionDep
from pipeboard.app.schemas import Message, ValidationFailed
from pipeboard.app.api.common import AUTH_RESPONSES, NOT_FOUND, JobId, Limit, Offset, ServiceRoute
from pipeboard.app.api import ownership
from pipeboard.app.api.security import ReadAccess, WriteAccess
from pipeboard.app.schemas import JobPublic, JobSpec, JobStatus, MetricsPublic, Page, TimelinePublic
from pipeboard.app.services import jobs, rundata

router = APIRouter(prefix="/jobs", tags=["jobs"], route_class=ServiceRoute, responses=AUTH_RESPONSES)

CONFLICT = {409: {"model": Message, "description": "The job's status does not allow this."}}


@router.post(
    "",
    response_model=JobPublic,
    status_code=201,
    summary="Submit a job",
    description=(
        "Queues profile -> plan -> train of a model as Celery work. The body is the job's specification "
        "(version 2, in sections: `model`, `layout`, `length`, `optimizer`, `machine`, `checkpoints`), checked "
        "here once: a field it does not know, a non-finite number, fields that disagree (microbatches that do not "
        "divide the batch, chunks the schedule does not take, more `layout.nodes` than live hosts, `machine.device` "
        "cuda with no GPU worker) are a 422 naming the field, and nothing is queued. The run receives the "
        "specification whole. The flat version-1 body (`model`, `schedule`, `stop`, `hyperparameters`, ...) is "
        "still accepted and stored as version 2. Higher `priority` runs first; the answer carries the queue position."
    ),
    responses={422: {"model": ValidationFailed, "description": "Invalid spec (the message names the field)."}},
)
def submit_job(spec: JobSpec, session: SessionDep, principal: WriteAccess) -> JobPublic:
    ownership.check_job_model(session, principal, spec.model.name)  # another user's model reads as unknown
    job = jobs.submit(session, spec, submitted_by=principal.name, owner_id=principal.user_id)
    return jobs.to_public(session, job)


@router.get(
    "",
    response_model=Page[JobPublic],
    summary="List jobs",
    description="Newest first, filtered by `status` and `kind` (train or profile). Stale running jobs are failed first.",
)
def list_jobs(
    session: SessionDep,
    principal: ReadAccess,
    offset: Offset = 0,
    limit: Limit = 50,
    status: Annotated[JobStatus | None, Query(description="Only jobs with this status.")] = None,
    kind: Annotated[Literal["train", "profile"] | None, Query(description="Only jobs of this kind.")] = None,
) -> Page[JobPublic]:
    rows, count = jobs.list_jobs(session, offset=offset, limit=limit, status=status, kind=kind,
                                 owner_id=ownership.owner_scope(principal))
    return Page(data=jobs.to_public_many(session, rows), count=count)


@router.get("/{job_id}", response_model=JobPublic, summary="Get a job", description="Status, queue position, spec, summary and error.", responses=NOT_FOUND)
def get_job(job_id: JobId, session: SessionDep, principal: ReadAccess) -> JobPublic:
    return jobs.to_public(session, ownership.job_for(session, principal, job_id))


@router.post(
    "/{job_id}/cancel",
    response_model=JobPublic,
    summary="Cancel a job",
    description="A queued job never starts; a running job's whole process group is ended within seconds.",
    responses={**NOT_FOUND, **CONFLICT},
)
def cancel_job(job_id: JobId, session: SessionDep, principal: WriteAccess) -> JobPublic:
    ownership.job_for(session, principal, job_id)  # another user's job: 404, as a missing one
    return jobs.to_public(session, jobs.cancel(session, job_id))


@router.post(
    "/{job_id}/retry",
    response_model=JobPublic,
    summary="Retry a job",
    description=(
        "Queues a failed or cancelled job again as a new attempt: it resumes from the job's newest complete checkpoint "
        "(from the start when there is none), and its metrics, timeline and event log continue. (An attempt lost to a "
        "killed process, a dead worker or a lost host is retried automatically, up to the job's `max_attempts`.)"),
    responses={**NOT_FOUND, **CONFLICT},
)
def retry_job(job_id: JobId, session: SessionDep, principal: WriteAccess) -> JobPublic:
    ownership.job_for(session, principal, job_id)
    return jobs.to_public(session, jobs.retry(session, job_id))


@router.get(
    "/{job_id}/timeline",
    response_model=TimelinePublic,
    summary="A job's timeline",
    description=(
        "Measured (the run) or predicted (the simulator) events, windowed by step and/or time and, past "
        "`limit` events, downsampled by keeping whole, evenly spaced steps. `after_seq` fetches only newer events."
    ),
    responses=NOT_FOUND,
)
def get_timeline(
    job_id: JobId,
    session: SessionDep,
    principal: ReadAccess,
    source: Annotated[Literal["measured", "predicted"], Query()] = "measured",
    step_from: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    step_to: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    t_from: Annotated[float | None, Query(ge=0, le=1e9, description="Seconds from the run's start.")] = None,
    t_to: Annotated[float | None, Query(ge=0, le=1e9)] = None,
    after_seq: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    limit: Annotated[int, Query(ge=1, le=200_000)] = 20_000,
) -> TimelinePublic:
    ownership.job_for(session, principal, job_id)
    return rundata.timeline(session, job_id, source=source, step_from=step_from, step_to=step_to, t_from=t_from, t_to=t_to, after_seq=after_seq, limit=limit)


@router.get(
    "/{job_id}/metrics",
    response_model=MetricsPublic,
    summary="A job's metric series",
    description="Points with loss, metric, samples_per_s and per-stage utilisation; evenly downsampled past `limit` (the last point is kept).",
    responses=NOT_FOUND,
)
def get_metrics(
    job_id: JobId,
    session: SessionDep,
    principal: ReadAccess,
    step_from: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    step_to: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    after_seq: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 5000,
) -> MetricsPublic:
    ownership.job_for(session, principal, job_id)
    return rundata.metrics(session, job_id, step_from=step_from, step_to=step_to, after_seq=after_seq, limit=limit)


@router.get(
    "/{job_id}/trace",
    summary="Chrome trace download",
    description="The timeline as Chrome trace JSON (chrome://tracing, ui.perfetto.dev), as an attachment.",
    responses={**NOT_FOUND, 200: {"content": {"application/json": {}}, "description": "Chrome trace JSON."}},
    response_class=Response,
)
def get_trace(
    job_id: JobId,
    session: SessionDep,
    principal: ReadAccess,
    source: Annotated[Literal["measured", "predicted"], Query()] = "measured",
) -> Response:
    ownership.job_for(session, principal, job_id)
    body = json.dumps(rundata.chrome_trace(session, job_id, source))
    return Response(body, media_type="application/json", headers={"Content-Disposition": f'attachment; filename="job-{job_id}-{source}.trace.json"'})
