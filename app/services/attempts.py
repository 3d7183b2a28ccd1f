"""A job's attempts: one row per run of it, and what a resumed attempt does to the job's data.

A job is submitted as attempt 1; an attempt lost to a killed process, a dead worker or a lost host
is followed by another (``auto``, up to the job's ``max_attempts``), and a retry request starts one
too (``manual``). Every attempt after the first trains from the newest complete checkpoint: when
its training reports the step it starts from (``resumed``), the measurements earlier attempts made
after that step are deleted (they are measured again, identically), and one ``attempt`` event in
the job's log says so, so a stream's reader drops them too: the job's metric series and timeline
read as one run, each step once. The new attempt's clock continues the job's: its timeline and
metric times are shifted by the wall time since the job's first training began (``offset_s``).

A one-host job's checkpoints are in the data folder of the host that ran it, so its next attempt
is meant for that worker (``holder``) while it lives, and for any once it does not (``unheld``,
``release``). Policy (when to retry) lives in jobs.py; this module keeps the rows.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from pipeboard.app.core.config import get_settings
from pipeboard.app.models import AttemptNode, EventSource, Job, JobAttempt, JobStatus, MetricPoint, WorkerHeartbeat
from pipeboard.app.models import TimelineEvent as TimelineEventRow
from pipeboard.app.schemas import AttemptPublic
from pipeboard.app.schemas.jobspec import stored
from pipeboard.app.services.placement import WAITING_FOR_GPUS
from pipeboard.app.services.tx import begin_write

def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def max_attempts(spec: dict[str, Any]) -> int:
    """The job's attempt budget (its specification, app/schemas/jobspec.py)."""
    return stored(spec).checkpoints.max_attempts


def checkpoint_every(spec: dict[str, Any]) -> int:
    return stored(spec).checkpoints.every


def nodes_of(spec: dict[str, Any]) -> int:
    return stored(spec).layout.nodes


def open_row(session: Session, job_id: int, attempt: int, trigger: str, nodes: int = 1, prefer: str | None = None) -> None:
    """Add attempt ``attempt`` (queued; for worker ``prefer`` when given); the caller commits."""
    session.add(JobAttempt(job_id=job_id, attempt=attempt, trigger=trigger, status=JobStatus.QUEUED, nodes=nodes,
                           prefer_node=prefer))


def holder(session: Session, job: Job) -> str | None:
    """The worker that ran the job's current attempt, if the job runs on one host and that worker
    is alive (or was, moments ago: a supervisor restarts it under the same name): its host's data
    folder holds the job's checkpoints, so the next attempt should run there. (On several hosts the
    ranks fetch each other's files: any hosts do.)"""
    if nodes_of(job.spec) > 1:
        return None
    node = session.scalar(select(AttemptNode.node).where(AttemptNode.job_id == job.id, AttemptNode.attempt == job.attempt,
                                                         AttemptNode.role == "leader"))
    seen = session.scalar(select(WorkerHeartbeat.seen_at).where(WorkerHeartbeat.hostname == node)) if node else None
    if seen is None or (utcnow() - _aware(seen)).total_seconds() > get_settings().stale_after_seconds:
        return None
    return node


def unheld(session: Session) -> list[tuple[int, int]]:
    """(job, attempt) of queued attempts waiting for a worker that stopped heart-beating: any
    worker may run them instead (from the start, or from checkpoints a shared folder holds)."""
    cutoff = utcnow().timestamp() - get_settings().stale_after_seconds
    rows = session.execute(
        select(Job.id, Job.attempt, WorkerHeartbeat.seen_at)
        .join(JobAttempt, (JobAttempt.job_id == Job.id) & (JobAttempt.attempt == Job.attempt))
        .outerjoin(WorkerHeartbeat, WorkerHeartbeat.hostname == JobAttempt.prefer_node)
        .where(Job.status == JobStatus.QUEUED, JobAttempt.prefer_node.is_not(None),
               JobAttempt.prefer_node != WAITING_FOR_GPUS)).all()  # waiting for GPUs: for no worker yet
    return [(job_id, attempt) for job_id, attempt, seen in rows if seen is None or _aware(seen).timestamp() < cutoff]


def release(session: Session, job_id: int, attempt: int) -> bool:
    """Let any worker run a queued attempt that waited for one; True when this call did."""
    begin_write(session)
    current = select(Job.id).where(Job.id == job_id, Job.status == JobStatus.QUEUED, Job.attempt == attempt).exists()
    done = session.execute(update(JobAttempt).where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt,
                                                    JobAttempt.prefer_node.is_not(None), current)
                           .values(prefer_node=None)).rowcount == 1
    session.commit()
    return done


def close_current(session: Session, job_id: int, status: JobStatus, error: str | None = None) -> None:
    """Give the job's current attempt its final status (in the caller's transaction)."""
    current = select(Job.attempt).where(Job.id == job_id).scalar_subquery()
    values: dict[str, Any] = {"status": status, "finished_at": utcnow()}
    if error is not None:
        values["error"] = error[-4000:]
    session.execute(update(JobAttempt).where(JobAttempt.job_id == job_id, JobAttempt.attempt == current,
                                             JobAttempt.status.in_((JobStatus.QUEUED, JobStatus.RUNNING))).values(**values))


def claimed(session: Session, job_id: int, attempt: int, node: str, host: str, nodes: int) -> None:
    """The attempt starts on ``node`` (a Celery worker on ``host``); the caller commits."""
    t = utcnow()
    row = session.get(JobAttempt, (job_id, attempt))
    if row is None:  # a job queued before attempts had rows
        open_row(session, job_id, attempt, "submit" if attempt <= 1 else "manual", nodes)
        session.flush()
        row = session.get(JobAttempt, (job_id, attempt))
    row.status, row.started_at, row.nodes = JobStatus.RUNNING, t, nodes
    session.add(AttemptNode(job_id=job_id, attempt=attempt, node=node, host=host, role="leader", joined_at=t, heartbeat_at=t))


def auto_left(session: Session, job: Job) -> int:
    """How many more automatic attempts the job may have after its current one."""
    triggers = session.scalars(select(JobAttempt.trigger).where(JobAttempt.job_id == job.id, JobAttempt.attempt <= job.attempt)
                               .order_by(JobAttempt.attempt.desc())).all()
    used = 0
    for trigger in triggers:  # the attempts since the submit or the last manual retry, both included
        used += 1
        if trigger != "auto":
            break
    return max(0, max_attempts(job.spec) - max(used, 1))


def clock_offset(session: Session, job_id: int, attempt: int) -> float:
    """Start the attempt's training clock: seconds since the job's first training began (0 for
    the first attempt that trains). Recorded once; asking again returns the same offset. The
    caller commits; it must hold no read of its own in this transaction (SQLite: the write below
    comes first, so it waits its turn rather than failing on a stale snapshot)."""
    session.execute(update(JobAttempt).where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt)
                    .values(attempt=JobAttempt.attempt))
    row = session.get(JobAttempt, (job_id, attempt))
    if row is None:  # a job that predates attempt rows, or made without the service (tests)
        open_row(session, job_id, attempt, "submit" if attempt <= 1 else "auto")
        session.flush()
        row = session.get(JobAttempt, (job_id, attempt))
        row.status = JobStatus.RUNNING
    if row.offset_s is not None:
        return row.offset_s
    now = utcnow()
    first = session.scalar(select(func.min(JobAttempt.train_started_at)).where(JobAttempt.job_id == job_id,
                                                                               JobAttempt.train_started_at.is_not(None)))
    if first is not None and first.tzinfo is None:
        first = first.replace(tzinfo=timezone.utc)
    row.train_started_at = now
    row.offset_s = (now - first).total_seconds() if first is not None else 0.0
    return row.offset_s


def resumed(session: Session, job_id: int, attempt: int, start_step: int, hosts: dict[int, str] | None) -> dict[str, Any]:
    """The attempt's training runs from ``start_step``: drop what earlier attempts measured after
    it and record where it started and on which hosts. Returns the `attempt` event's payload; the
    caller appends it and commits, in the same transaction."""
    session.execute(delete(MetricPoint).where(MetricPoint.job_id == job_id, MetricPoint.attempt < attempt,
                                              MetricPoint.step > start_step))
    # timeline events carry the 0-based index of their step: step k is the (k+1)-th
    session.execute(delete(TimelineEventRow).where(TimelineEventRow.job_id == job_id, TimelineEventRow.source == EventSource.MEASURED,
                                                   TimelineEventRow.attempt < attempt, TimelineEventRow.step >= start_step))
    clean_hosts = {str(rank): str(host) for rank, host in (hosts or {}).items()}
    session.execute(update(JobAttempt).where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt)
                    .values(resume_step=start_step, hosts=clean_hosts or None))
    offset = session.scalar(select(JobAttempt.offset_s).where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt))
    where = f"from the checkpoint at step {start_step}" if start_step else "from the start"
    on = sorted(set(clean_hosts.values()))
    return {"attempt": attempt, "resume_step": start_step, "offset_s": offset or 0.0, "hosts": clean_hosts,
            "message": f"attempt {attempt} trains {where}" + (f" on {', '.join(on)}" if on else "")}


def hosts_by_attempt(session: Session, job_id: int) -> dict[int, dict[str, str]]:
    rows = session.execute(select(JobAttempt.attempt, JobAttempt.hosts).where(JobAttempt.job_id == job_id)).all()
    return {attempt: hosts or {} for attempt, hosts in rows}


def public(session: Session, job_ids: list[int]) -> dict[int, list[AttemptPublic]]:
    """Each job's attempts, oldest first, in two queries for all of them."""
    rows = session.scalars(select(JobAttempt).where(JobAttempt.job_id.in_(job_ids))
                           .order_by(JobAttempt.job_id, JobAttempt.attempt)).all()
    nodes: dict[tuple[int, int], list[str]] = {}
    for job_id, attempt, host in session.execute(
            select(AttemptNode.job_id, AttemptNode.attempt, AttemptNode.host).where(AttemptNode.job_id.in_(job_ids))
            .order_by(AttemptNode.job_id, AttemptNode.attempt, AttemptNode.role, AttemptNode.host)).all():
        hosts = nodes.setdefault((job_id, attempt), [])
        if host not in hosts:
            hosts.append(host)
    out: dict[int, list[AttemptPublic]] = {job_id: [] for job_id in job_ids}
    for r in rows:
        out[r.job_id].append(AttemptPublic(
            attempt=r.attempt, trigger=r.trigger, status=r.status.value, created_at=r.created_at, started_at=r.started_at,
            finished_at=r.finished_at, resume_step=r.resume_step, offset_s=r.offset_s, error=r.error, hosts=r.hosts,
            nodes=nodes.get((r.job_id, r.attempt), []), waiting=r.waiting))
    return out


def nodes_of_running(session: Session, node: str) -> list[tuple[int, int]]:
    """(job, attempt) pairs running now whose current attempt has ``node`` among its hosts."""
    return [tuple(r) for r in session.execute(
        select(Job.id, Job.attempt).join(AttemptNode, (AttemptNode.job_id == Job.id) & (AttemptNode.attempt == Job.attempt))
        .where(Job.status == JobStatus.RUNNING, AttemptNode.node == node)).all()]


def trained_s(session: Session, job_id: int, before: int) -> float:
    """Seconds the job's attempts before ``before`` spent training (from their training's start
    to their end): what a time-limited job has used up."""
    rows = session.execute(select(JobAttempt.train_started_at, JobAttempt.finished_at)
                           .where(JobAttempt.job_id == job_id, JobAttempt.attempt < before)).all()
    total = 0.0
    for start, end in rows:
        if start is not None and end is not None:
            total += max(0.0, (_aware(end) - _aware(start)).total_seconds())
    return total


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def recorded_step(session: Session, job_id: int) -> int:
    """The last training step the job has measurements of (0: none): a next attempt resumes from a
    checkpoint at or before it, so no step between the two goes unmeasured."""
    return session.scalar(select(func.coalesce(func.max(MetricPoint.step), 0)).where(MetricPoint.job_id == job_id)) or 0


def stale_members(session: Session, cutoff: datetime) -> list[tuple[int, int, str, str, int | None, datetime]]:
    """(job, attempt, node, host, pgid, last heartbeat) of the joined other hosts of running
    attempts whose heartbeat is older than ``cutoff``."""
    rows = session.execute(
        select(Job.id, Job.attempt, AttemptNode.node, AttemptNode.host, AttemptNode.pgid, AttemptNode.heartbeat_at)
        .join(AttemptNode, (AttemptNode.job_id == Job.id) & (AttemptNode.attempt == Job.attempt))
        .where(Job.status == JobStatus.RUNNING, AttemptNode.role == "member", AttemptNode.joined_at.is_not(None),
               AttemptNode.heartbeat_at < cutoff)).all()
    return [tuple(r) for r in rows]
