"""A job as the API shows it (JobPublic): its queue position, its attempts, the newest sequence
number of its log and its prediction figures, one job at a time or a page of them with a few
queries for all.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from pipeboard.app.models import Job, JobEvent, JobStatus
from pipeboard.app.schemas import JobPublic
from pipeboard.app.schemas.jobspec import stored
from pipeboard.app.services import attempts, events, fidelity


def queue_position(session: Session, job: Job) -> int | None:
    """1 = the next job a free worker will claim; None unless queued."""
    if job.status != JobStatus.QUEUED:
        return None
    ahead = session.scalar(
        select(func.count())
        .select_from(Job)
        .where(
            Job.status == JobStatus.QUEUED,
            or_(Job.priority > job.priority, and_(Job.priority == job.priority, Job.id < job.id)),
        )
    )
    return int(ahead or 0) + 1


def to_public(session: Session, job: Job, *, position: int | None | bool = False, last_seq: int | None = None,
              tries: list[Any] | None = None) -> JobPublic:
    """``position``/``last_seq``/``tries`` (its attempts) may be precomputed (lists); otherwise they are queried."""
    tries = attempts.public(session, [job.id])[job.id] if tries is None else tries
    waiting = next((a.waiting for a in tries if a.attempt == job.attempt), None) if job.status == JobStatus.QUEUED else None
    return JobPublic(
        id=job.id,
        name=job.name,
        status=job.status.value,
        priority=job.priority,
        queue_position=queue_position(session, job) if position is False else position,
        waiting=waiting,
        spec=stored(job.spec),
        attempt=job.attempt,
        error=job.error,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        heartbeat_at=job.heartbeat_at,
        worker=job.worker_hostname,
        submitted_by=job.submitted_by,
        profile_id=job.profile_id,
        plan_id=job.plan_id,
        summary=job.summary,
        fidelity=fidelity.latest(session, job),
        last_event_seq=events.last_seq(session, job.id) if last_seq is None else last_seq,
        attempts=tries,
    )


def to_public_many(session: Session, rows: list[Job]) -> list[JobPublic]:
    """A page of jobs with a few queries for all positions, sequence numbers and attempts, not some per job."""
    if not rows:
        return []
    queued = session.scalars(select(Job.id).where(Job.status == JobStatus.QUEUED).order_by(Job.priority.desc(), Job.id.asc())).all()
    positions = {job_id: i + 1 for i, job_id in enumerate(queued)}
    ids = [j.id for j in rows]
    seqs = dict(session.execute(select(JobEvent.job_id, func.max(JobEvent.seq)).where(JobEvent.job_id.in_(ids)).group_by(JobEvent.job_id)).all())
    tries = attempts.public(session, ids)
    return [to_public(session, j, position=positions.get(j.id), last_seq=seqs.get(j.id, 0), tries=tries[j.id]) for j in rows]
