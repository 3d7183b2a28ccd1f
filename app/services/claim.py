"""Claiming a queued job for a worker: the one conditional UPDATE that moves the best queued job
(or one attempt meant for this worker) to running and starts its attempt, so two workers never
both take it. The job runner (app/services/runner.py) calls it before it runs the job.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import or_, select, update

from pipeboard.app.core.config import get_settings
from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import Job, JobAttempt, JobStatus
from pipeboard.app.services import attempts, events
from pipeboard.app.services.tx import begin_write


def now() -> datetime:
    return datetime.now(timezone.utc)


def claim_next(task_id: str | None, node: str | None = None, job_id: int | None = None,
               attempt: int | None = None) -> int | None:
    """Atomically move the best queued job to running on this worker (Celery node ``node``) and
    start its attempt; None when nothing is queued. Attempts meant for another worker (whose host
    holds their checkpoints) are passed by; with ``job_id`` and ``attempt``, only that one is taken."""
    host = get_settings().node_name
    node = node or f"pipeboard@{host}"
    if job_id is not None:
        which = [Job.id == job_id, Job.attempt == attempt]
    else:
        meant = select(JobAttempt.prefer_node).where(JobAttempt.job_id == Job.id, JobAttempt.attempt == Job.attempt)
        which = [or_(meant.scalar_subquery().is_(None), meant.scalar_subquery() == node)]
    with get_sessionmaker()() as s:
        for _ in range(10):
            candidate = s.execute(
                select(Job.id, Job.attempt, Job.spec).where(Job.status == JobStatus.QUEUED, *which)
                .order_by(Job.priority.desc(), Job.id.asc()).limit(1)
            ).first()
            if candidate is None:
                return None
            candidate, attempt, spec = candidate
            begin_write(s)
            t = now()
            result = s.execute(
                update(Job)
                .where(Job.id == candidate, Job.status == JobStatus.QUEUED, Job.attempt == attempt)
                .values(status=JobStatus.RUNNING, started_at=t, heartbeat_at=t, celery_task_id=task_id,
                        worker_hostname=host, pid=None, pgid=None)
            )
            if result.rowcount == 1:
                attempts.claimed(s, candidate, attempt, node, host, attempts.nodes_of(spec))
                published = events.append(s, candidate, [("status", {"status": "running", "attempt": attempt,
                                                                     "message": f"attempt {attempt} claimed by {node}"})], commit=False)
                s.commit()
                events.publish(candidate, published)
                return candidate
            s.rollback()  # another worker won this one; look again
    return None
