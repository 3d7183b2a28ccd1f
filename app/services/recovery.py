"""When a worker is known to be gone: retry (or fail) the attempts it took part in, at once.

`pipeboard up` calls `node_lost` when a worker it supervises exits (it has the exit code: no need
to wait for heartbeats to go stale); workers call `reap_periodically`, so a job whose worker died
is retried even when nobody is looking at it (the API reaps too, on reads and open streams).
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.orm import Session

from pipeboard.app.core.config import get_settings
from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import AttemptNode, Job
from pipeboard.app.services import attempts, jobs

log = logging.getLogger(__name__)


def node_lost(session: Session, node: str, reason: str) -> list[str]:
    """Worker ``node`` is gone: each running attempt it took part in is retried (or, out of
    attempts, failed); its local process groups are ended first. Returns one line per job."""
    lines = []
    for job_id, attempt in attempts.nodes_of_running(session, node):
        job = session.get(Job, job_id)
        part = session.get(AttemptNode, (job_id, attempt, node))
        if part is not None and part.role == "member":  # its agent's group, on that host
            jobs.kill_group_if_local(part.pgid, part.host)
        else:
            jobs.end_group_if_local(job.pgid, job.worker_hostname,
                                    hold=lambda: jobs.hold_heartbeat(session, job_id, attempt))
        line = jobs.fail_or_retry(session, job_id, attempt, f"attempt {attempt} lost: {reason}", retryable=True,
                                  message="worker lost")
        if line:
            lines.append(line)
    return lines


def reap_periodically(stop: threading.Event) -> None:
    """Until ``stop``: every heartbeat period, retry or fail running jobs whose heartbeats went stale."""
    period = get_settings().heartbeat_seconds
    while not stop.wait(period):
        try:
            with get_sessionmaker()() as session:
                jobs.reap_stale(session)
        except Exception as exc:  # a busy or unreachable database must not end the thread
            log.warning("reaping stale jobs failed: %s", exc)
