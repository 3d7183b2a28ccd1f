"""Celery tasks: thin wrappers; the logic is in app/services/runner.py.

`pipeboard.run_job` runs the best queued job (see app/services/jobs.py for why a task does not
insist on its own job id). acks_late: a task is acknowledged only when it returns, so a worker
that stops gracefully mid-job hands it back; a SIGKILLed one is covered by heartbeats.
"""

from __future__ import annotations

from app.services import runner
from app.worker import celery_app


@celery_app.task(name="pipeboard.run_job", bind=True, acks_late=True)
def run_job(self, job_id: int) -> int | None:
    """Claim and run the best queued job (usually ``job_id``); returns the id it ran."""
    return runner.run_next(self.request.id)
