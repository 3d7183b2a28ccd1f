"""Celery tasks: thin wrappers; the logic is in app/services/runner.py and model_checks.py.

`pipeboard.run_job` runs the best queued job (see app/services/jobs.py for why a task does not
insist on its own job id). acks_late: a task is acknowledged only when it returns, so a worker
that stops gracefully mid-job hands it back; a SIGKILLed one is covered by heartbeats.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import signals
from celery.exceptions import Reject

from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.services import member, model_checks, recovery, runner, storage
from pipeboard.app.worker import celery_app


@celery_app.task(name="pipeboard.run_job", bind=True, acks_late=True)
def run_job(self, job_id: int) -> int | None:
    """Claim and run the best queued job (usually ``job_id``); returns the id it ran. A worker
    that is shutting down hands the task back to the broker for another (the retry of a job it
    gave up may reach it before it stops consuming)."""
    if _shutting_down.is_set():
        raise Reject("the worker is shutting down", requeue=True)
    return runner.run_next(self.request.id, self.request.hostname)


@celery_app.task(name="pipeboard.resume_job", bind=True, acks_late=True)
def resume_job(self, job_id: int, attempt: int) -> int | None:
    """Run attempt ``attempt`` of job ``job_id`` if it is still queued: sent to this worker's own
    queue because its host holds the job's checkpoints."""
    if _shutting_down.is_set():
        raise Reject("the worker is shutting down", requeue=True)
    return runner.run_next(self.request.id, self.request.hostname, job_id, attempt)


@celery_app.task(name="pipeboard.join_job", bind=True, acks_late=True)
def join_job(self, job_id: int, attempt: int) -> None:
    """Take part in attempt ``attempt`` of a job on several hosts that another worker leads: run
    torch's elastic agent for this host's share (sent to this worker's own queue)."""
    member.run_member(job_id, attempt, self.request.hostname)


@celery_app.task(name="pipeboard.validate_model", acks_late=True)
def validate_model(model_id: int) -> str | None:
    """Validate a registered model in a subprocess (app/services/model_checks.py); its status."""
    with get_sessionmaker()() as session:
        status = model_checks.validate_model(session, model_id)
    return status.value if status is not None else None


_shutting_down = threading.Event()


@signals.worker_ready.connect
def _start_reaping(**_: Any) -> None:
    """Retry jobs whose worker died even when no one reads them through the API."""
    threading.Thread(target=recovery.reap_periodically, args=(_shutting_down,), name="pipeboard-reaper", daemon=True).start()
    # and drop old finished jobs' action timelines (PIPEBOARD_DETAIL_RETENTION_DAYS), daily
    threading.Thread(target=storage.prune_periodically, args=(_shutting_down,), name="pipeboard-retention", daemon=True).start()


@signals.worker_shutting_down.connect
def _abandon_running_jobs(**_: Any) -> None:
    """Ctrl-C / SIGTERM on a worker: fail its running jobs (retryable) and end their runs now,
    rather than wait for runs of any length or orphan them when the worker is killed later."""
    _shutting_down.set()
    runner.abandon_all("the worker was stopped while the job ran")
