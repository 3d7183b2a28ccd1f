"""Job lifecycle in the database: submit, list, get, cancel, retry, reaping.

Every status change is one conditional UPDATE (`... WHERE status = <expected>`) committed with
the job-log event that announces it, so two actors (a cancel and the worker finishing) can never
both win, and a stream never sees a status the database does not have.

Celery runs the work (app/tasks.py -> app/services/runner.py). Priority does not depend on the
broker: each submit enqueues one task, and a task claims the best queued job when it starts
(highest priority, then oldest), so the queue order is the database's, on SQLite and Redis alike.

The checks a specification passes at the door are app/services/spec_checks.py's; a job as the
API shows it (with its queue position) is app/services/job_views.py's.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from pipeboard.app.core.config import get_settings
from pipeboard.app.core.lifetime import group_alive
from pipeboard.app.models import Job, JobAttempt, JobStatus
from pipeboard.app.schemas import JobSpec
from pipeboard.app.services import attempts, events, placement
from pipeboard.app.services.errors import NotFound, ServiceError
# what the API shows of a job, importable from here as before (app/api/, tests/)
from pipeboard.app.services.job_views import queue_position, to_public, to_public_many  # noqa: F401
# the checks at the door, importable from here as before (app/services/plans.py, app/api/, tests/)
from pipeboard.app.services.spec_checks import (  # noqa: F401
    check_data_in_context, check_spec, gpu_request, gpu_workers, live_hosts, validate_model, validate_model_args, zoo_args)
from pipeboard.app.services.tx import begin_write

log = logging.getLogger(__name__)

FINAL = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def submit(session: Session, spec: JobSpec, *, kind: str = "train", enqueue: bool = True,
           submitted_by: str | None = None, owner_id: int | None = None) -> Job:
    check_spec(session, spec, kind)
    begin_write(session)
    job = Job(
        name=spec.name or f"{spec.model.name} {spec.layout.schedule}",
        kind=kind,
        status=JobStatus.QUEUED,
        priority=spec.priority,
        spec=spec.model_dump(mode="json"),
        submitted_by=submitted_by,
        owner_id=owner_id,  # the submitting token's user (app/api/ownership.py)
        attempt=1,
    )
    session.add(job)
    session.flush()
    attempts.open_row(session, job.id, 1, "submit", spec.layout.nodes)
    events.append(session, job.id, [("status", {"status": "queued", "message": "submitted"})], commit=False)
    session.commit()
    if enqueue and spec.machine.device == "cuda":
        dispatch_cuda(session, job.id, 1, spec)
    elif enqueue:
        enqueue_or_fail(session, job.id)
    return job


def dispatch_cuda(session: Session, job_id: int, attempt: int, spec: JobSpec) -> placement.GpuPlacement | placement.Waiting:
    """Place a cuda attempt on a worker with GPUs free and queue it on that worker's own queue
    (the existing enqueue path), or leave it waiting with its reason (``job_attempts.waiting``)."""
    decision = placement.dispatch(session, job_id, attempt, gpu_request(job_id, spec),
                                  lambda j, node, a: enqueue_or_fail(session, j, node=node, attempt=a))
    session.commit()
    return decision


def dispatch_waiting(session: Session) -> int:
    """Dispatch again every queued cuda attempt that waits for GPUs, in queue order (called when an
    attempt ends and frees its GPUs); returns how many were placed."""
    rows = session.execute(select(Job.id, Job.attempt, Job.spec).join(
        JobAttempt, (JobAttempt.job_id == Job.id) & (JobAttempt.attempt == Job.attempt))
        .where(Job.status == JobStatus.QUEUED, JobAttempt.prefer_node == placement.WAITING_FOR_GPUS)
        .order_by(Job.priority.desc(), Job.id)).all()
    placed = 0
    for job_id, attempt, raw in rows:
        if isinstance(dispatch_cuda(session, job_id, attempt, JobSpec.model_validate(raw)), placement.GpuPlacement):
            placed += 1
    return placed


def enqueue_or_fail(session: Session, job_id: int, *, node: str | None = None, attempt: int | None = None) -> None:
    """Queue the job's task (for attempt ``attempt`` on worker ``node``, when given); if the broker
    cannot take it, the job fails (retryable) and the client gets a 503 saying so, rather than a
    job that waits forever for a task that never comes."""
    try:
        enqueue_run(job_id, node, attempt)
    except Exception as exc:
        reason = f"broker: cannot queue the job ({type(exc).__name__}: {exc})"
        finish(session, job_id, JobStatus.FAILED, expected=(JobStatus.QUEUED,), error=reason, message="not queued")
        raise ServiceError(reason, status=503, field="broker") from None


def enqueue_run(job_id: int, node: str | None = None, attempt: int | None = None) -> None:
    """One Celery task per queued job; the task claims the best queued job when it starts. An
    attempt meant for one worker (its host holds the checkpoints) goes to that worker's own queue
    as a task for that attempt alone, and the others' tasks pass it by."""
    if node is None:
        send_task("pipeboard.run_job", job_id)
    else:
        from celery.utils import worker_direct

        send_task("pipeboard.resume_job", job_id, attempt, queue=worker_direct(node))


def send_task(name: str, *args: Any, queue: Any = None) -> None:
    """Queue Celery task ``name`` on the configured broker (raises when the broker cannot take it);
    ``queue``: a particular one (a worker's own, `celery.utils.worker_direct(node)`), default the common one."""
    app = producer(get_settings().broker_url)
    # A connection of our own rather than kombu's global producer pool: the pool registers
    # after-fork hooks that would run (and can hang) in processes this one forks later.
    with app.connection_for_write() as connection:
        app.send_task(name, args=list(args), connection=connection, ignore_result=True, queue=queue,
                      retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2, "interval_max": 0.5})


@lru_cache(maxsize=4)
def producer(broker_url: str):
    """A Celery app for sending to ``broker_url``: the current settings' broker, even when they
    changed after `pipeboard.app.worker` was imported (tests, `pipeboard up` with flags)."""
    from pipeboard.app.worker import make_celery

    return make_celery(get_settings())


def get(session: Session, job_id: int) -> Job:
    reap_stale(session)
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound("job", job_id)
    return job


def list_jobs(session: Session, *, offset: int, limit: int, status: str | None = None, kind: str | None = None,
              owner_id: int | None = None) -> tuple[list[Job], int]:
    reap_stale(session)
    where = [Job.owner_id == owner_id] if owner_id is not None else []
    if status:
        where.append(Job.status == JobStatus(status))
    if kind:
        where.append(Job.kind == kind)
    count = session.scalar(select(func.count()).select_from(Job).where(*where)) or 0
    rows = session.scalars(select(Job).where(*where).order_by(Job.id.desc()).offset(offset).limit(limit)).all()
    return list(rows), count


def finish(session: Session, job_id: int, status: JobStatus, *, expected: tuple[JobStatus, ...], error: str | None = None, message: str = "", summary: dict[str, Any] | None = None, attempt: int | None = None, **extra: Any) -> bool:
    """Move a job to a final status if it is in one of ``expected`` (and on ``attempt``, when
    given: a runner that outlived its attempt cannot end the next one); commit it with its end event."""
    begin_write(session)
    values: dict[str, Any] = {"status": status, "finished_at": utcnow(), **extra}
    if error is not None:
        values["error"] = error[-4000:]
    if summary is not None:
        values["summary"] = summary
    where = [Job.id == job_id, Job.status.in_(expected)] + ([Job.attempt == attempt] if attempt is not None else [])
    attempts.close_current(session, job_id, status, error)  # before the job's row moves: it matches the current one
    result = session.execute(update(Job).where(*where).values(**values))
    if result.rowcount != 1:
        session.rollback()
        return False
    payload = {"status": status.value, "message": message or status.value}
    if error:
        payload["error"] = error[-2000:]
    published = events.append(session, job_id, [("status", payload), (events.END_EVENT, payload)], commit=False)
    session.commit()
    events.publish(job_id, published)
    try:  # its attempt ended and freed any GPUs it held: cuda jobs waiting for them may go now
        dispatch_waiting(session)
    except ServiceError as exc:  # the broker refused; that job failed saying so, this one's end stands
        logging.getLogger(__name__).warning("dispatching waiting cuda jobs: %s", exc)
    return True


def cancel(session: Session, job_id: int) -> Job:
    """Queued: cancelled at once. Running: cancelled now; the worker's monitor ends the process
    group within a heartbeat (and the run's own sink ends it if that worker is gone)."""
    job = get(session, job_id)
    if job.status in FINAL:
        raise ServiceError(f"status: job {job_id} is already {job.status.value}", status=409, field="status")
    was_running = job.status == JobStatus.RUNNING
    if not finish(session, job_id, JobStatus.CANCELLED, expected=(JobStatus.QUEUED, JobStatus.RUNNING), message="cancelled by request", cancel_requested=True):
        session.refresh(job)
        raise ServiceError(f"status: job {job_id} is already {job.status.value}", status=409, field="status")
    session.refresh(job)
    if was_running:
        kill_group_if_local(job.pgid, job.worker_hostname, signal.SIGTERM)
    return job


def retry(session: Session, job_id: int) -> Job:
    """Run a failed or cancelled job again as a new attempt: it resumes from the job's newest
    complete checkpoint (from the start when there is none), and its event log, metrics and
    timeline continue."""
    job = get(session, job_id)
    if job.status not in (JobStatus.FAILED, JobStatus.CANCELLED):
        raise ServiceError(f"status: only failed or cancelled jobs can be retried; job {job_id} is {job.status.value}", status=409, field="status")
    if not requeue(session, job, trigger="manual", expected=(JobStatus.FAILED, JobStatus.CANCELLED),
                   message="retry: a new attempt resumes from the newest checkpoint"):
        raise ServiceError(f"status: job {job_id} changed meanwhile; try again", status=409, field="status")
    session.refresh(job)
    return job


def requeue(session: Session, job: Job, *, trigger: str, expected: tuple[JobStatus, ...], message: str,
            error: str | None = None) -> bool:
    """Queue ``job`` again as attempt ``job.attempt + 1`` if it is still in ``expected`` on its
    current attempt; commit that with the attempt's row and a `status` event (no `end`: a stream
    follows the job into its next attempt), then send its task. False when someone else moved it."""
    attempt = job.attempt
    prefer = attempts.holder(session, job)
    begin_write(session)
    if error is not None:
        attempts.close_current(session, job.id, JobStatus.FAILED, error)
    result = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status.in_(expected), Job.attempt == attempt)
        .values(status=JobStatus.QUEUED, error=None, started_at=None, finished_at=None, heartbeat_at=None,
                cancel_requested=False, attempt=attempt + 1)
    )
    if result.rowcount != 1:
        session.rollback()
        return False
    attempts.open_row(session, job.id, attempt + 1, trigger, attempts.nodes_of(job.spec), prefer=prefer)
    payload: dict[str, Any] = {"status": "queued", "message": message, "attempt": attempt + 1}
    if error:
        payload["error"] = error[-2000:]
    if prefer:
        payload["worker"] = prefer
    published = events.append(session, job.id, [("status", payload)], commit=False)
    session.commit()
    events.publish(job.id, published)
    enqueue_or_fail(session, job.id, node=prefer, attempt=attempt + 1)
    return True


def fail_or_retry(session: Session, job_id: int, attempt: int, error: str, *, retryable: bool, message: str = "") -> str | None:
    """End attempt ``attempt`` of a running job: queue the next attempt if the failure is
    ``retryable`` (a process, a worker or a host lost) and the job has automatic attempts left,
    else fail the job. Returns what happened, in words; None when the job had moved on already."""
    job = session.get(Job, job_id)
    if job is None or job.status != JobStatus.RUNNING or job.attempt != attempt:
        return None
    left = attempts.auto_left(session, job) if retryable else 0
    if left:
        if requeue(session, job, trigger="auto", expected=(JobStatus.RUNNING,), error=error,
                   message=f"attempt {attempt} failed ({error.splitlines()[0] if error else message}); attempt {attempt + 1} "
                           f"resumes from the newest checkpoint"):
            return f"job {job_id}: attempt {attempt} failed, attempt {attempt + 1} queued ({error})"
        return None
    why = "" if not retryable else f" (no automatic attempt left of {attempts.max_attempts(job.spec)}; retry it to resume)"
    if finish(session, job_id, JobStatus.FAILED, expected=(JobStatus.RUNNING,), error=error + why, message=message or "failed",
              attempt=attempt):
        return f"job {job_id}: failed on attempt {attempt} ({error}{why})"
    return None


def kill_group_if_local(pgid: int | None, node: str | None, sig: int = signal.SIGKILL) -> bool:
    """End a run's process group when it runs on this host (the worker's monitor does it anyway;
    this makes cancel immediate and covers a worker that died)."""
    if not pgid or node != get_settings().node_name:
        return False
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def end_group_if_local(pgid: int | None, node: str | None, hold: Callable[[], None] | None = None,
                       grace_s: float = 5.0) -> bool:
    """End a lost run's process group when it runs on this host, letting it hand over first: SIGTERM
    (`pipeboard train` then stops its stages and writes what they reported: the next attempt
    resumes from a checkpoint at or before the last step recorded), SIGKILL for whatever is left
    after ``grace_s``. ``hold()``, called every quarter second meanwhile, keeps others off the
    attempt (the reaper, which does not wait, would take it over once its heartbeat is stale)."""
    if not kill_group_if_local(pgid, node, signal.SIGTERM):
        return False
    deadline = time.monotonic() + grace_s
    while group_alive(pgid) and time.monotonic() < deadline:
        if hold is not None:
            hold()
        time.sleep(0.25)
    kill_group_if_local(pgid, node)
    return True


def hold_heartbeat(session: Session, job_id: int, attempt: int) -> None:
    """Refresh a running attempt's heartbeat on its behalf (its worker is gone, its run ending)."""
    session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.attempt == attempt)
                    .values(heartbeat_at=utcnow()))
    session.commit()


def reap_stale(session: Session) -> int:
    """Retry (or fail, when it has no automatic attempt left) running jobs whose worker stopped
    heart-beating: Celery will not redeliver a task whose worker was SIGKILLed, so without this
    they would stay "running" forever."""
    settings = get_settings()
    cutoff = utcnow() - timedelta(seconds=settings.stale_after_seconds)
    stale = session.scalars(
        select(Job).where(Job.status == JobStatus.RUNNING, or_(Job.heartbeat_at < cutoff, and_(Job.heartbeat_at.is_(None), Job.started_at < cutoff)))
    ).all()
    reaped = 0
    for job in stale:
        last = job.heartbeat_at.isoformat(timespec="seconds") if job.heartbeat_at else "never"
        error = f"worker {job.worker_hostname or '?'} stopped sending heartbeats (last {last})"
        kill_group_if_local(job.pgid, job.worker_hostname)  # before a next attempt can start beside it
        if fail_or_retry(session, job.id, job.attempt, error, retryable=True, message="worker lost"):
            reaped += 1
            log.warning("job %s: %s", job.id, error)
    # queued attempts waiting for a worker that is gone: any worker may take them now
    for job_id, attempt in attempts.unheld(session):
        if placement.unplace(session, job_id, attempt):  # a cuda attempt: placed again, on a worker with GPUs
            session.commit()
        elif attempts.release(session, job_id, attempt):
            enqueue_or_fail(session, job_id)
    try:  # cuda jobs waiting for GPUs: a GPU worker may have come (or one gone, above) since they were placed
        dispatch_waiting(session)
    except Exception as exc:  # the broker refused (that job failed saying so), or a row it could not read:
        session.rollback()  # the reaper and the read that called it go on
        log.warning("dispatching waiting cuda jobs: %s", exc)
    # the other hosts of jobs on several hosts: each member's worker heart-beats its own row
    for job_id, attempt, node, host, pgid, last in attempts.stale_members(session, cutoff):
        error = f"host {host}'s worker {node} stopped sending heartbeats (last {last.isoformat(timespec='seconds')})"
        kill_group_if_local(pgid, host)
        if fail_or_retry(session, job_id, attempt, error, retryable=True, message="host lost"):
            reaped += 1
            log.warning("job %s: %s", job_id, error)
    return reaped
