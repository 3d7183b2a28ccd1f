"""A job's disk use, and reclaiming it: the action timeline (detail) of finished jobs goes, the
per-step summaries stay (docs/storage.md).

Bytes are the stored values' lengths (each column as text), summed per table and job, the same
measure on SQLite and PostgreSQL; indexes and page overhead come on top, which the database file's
size (`database_file_bytes`, SQLite only) shows as a whole.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import String, Text, cast, delete, func, select
from sqlalchemy.orm import Session

from pipeboard.app.models import EventSource, Job, JobEvent, JobStatus, MetricPoint
from pipeboard.app.models import TimelineEvent as TimelineEventRow

# what a job stores, by name in the answer
TABLES = {"timeline_events": TimelineEventRow, "metric_points": MetricPoint, "job_events": JobEvent}
FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


def _bytes_expr(model: Any) -> Any:
    columns = list(model.__table__.columns)
    total = None
    for column in columns:
        length = func.coalesce(func.length(cast(column, Text if not isinstance(column.type, String) else column.type)), 0)
        total = length if total is None else total + length
    return func.coalesce(func.sum(total), 0)


def usage(session: Session, job_id: int) -> dict[str, Any]:
    """Rows and bytes per table of one job, and which of its steps keep their full action timeline."""
    tables = {}
    for name, model in TABLES.items():
        rows, size = session.execute(select(func.count(), _bytes_expr(model)).where(model.job_id == job_id)).one()
        tables[name] = {"rows": int(rows), "bytes": int(size)}
    detail_steps = session.scalar(select(func.count(func.distinct(TimelineEventRow.step))).where(
        TimelineEventRow.job_id == job_id, TimelineEventRow.source == EventSource.MEASURED)) or 0
    summarised = session.scalar(select(func.count()).select_from(MetricPoint).where(MetricPoint.job_id == job_id)) or 0
    return {
        "job_id": job_id,
        "tables": tables,
        "rows": sum(t["rows"] for t in tables.values()),
        "bytes": sum(t["bytes"] for t in tables.values()),
        "detail_steps": int(detail_steps),
        "metric_points": int(summarised),
    }


def database_file_bytes(session: Session) -> int | None:
    """The SQLite file's size with its WAL (None on a server database)."""
    url = session.get_bind().url
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    path = Path(url.database)
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def prunable_jobs(session: Session, older_than_days: float, now: datetime | None = None) -> list[int]:
    """Finished jobs that ended more than ``older_than_days`` ago and still keep detail."""
    cutoff = (now or datetime.now(timezone.utc)) - timedelta(days=older_than_days)
    has_detail = select(TimelineEventRow.job_id).where(TimelineEventRow.job_id == Job.id,
                                                       TimelineEventRow.source == EventSource.MEASURED).exists()
    return list(session.scalars(select(Job.id).where(Job.status.in_(FINISHED), Job.finished_at.is_not(None),
                                                     Job.finished_at < cutoff, has_detail).order_by(Job.id)))


def drop_detail(session: Session, job_id: int, *, keep_first_steps: int = 0) -> int:
    """Delete a finished job's measured actions except those of its first ``keep_first_steps`` steps
    (a thinned job keeps its opening window); the summaries stay. Returns the rows deleted."""
    job = session.get(Job, job_id)
    if job is None:
        raise LookupError(f"job {job_id} does not exist")
    if job.status not in FINISHED:
        raise ValueError(f"job {job_id} is {job.status.value}: only a finished job's detail can be dropped")
    where = [TimelineEventRow.job_id == job_id, TimelineEventRow.source == EventSource.MEASURED]
    first = session.scalar(select(func.min(TimelineEventRow.step)).where(*where))
    if first is not None and keep_first_steps > 0:
        where.append(TimelineEventRow.step >= first + keep_first_steps)
    deleted = session.execute(delete(TimelineEventRow).where(*where)).rowcount or 0
    session.commit()
    return int(deleted)


def prune(session: Session, older_than_days: float, *, keep_first_steps: int = 0, vacuum: bool = False) -> dict[str, Any]:
    """Drop (or thin to the first steps) the detail of every finished job older than the limit;
    ``vacuum`` gives the freed pages back to the file system (SQLite's VACUUM; PostgreSQL reuses them)."""
    before = database_file_bytes(session)
    pruned = {}
    for job_id in prunable_jobs(session, older_than_days):
        pruned[job_id] = drop_detail(session, job_id, keep_first_steps=keep_first_steps)
    if vacuum and before is not None:
        session.commit()
        session.close()
        # outside any transaction (the engine's connections begin their own): a raw sqlite3 connection
        raw = session.get_bind().raw_connection()
        try:
            driver = raw.driver_connection
            driver.isolation_level = None
            driver.execute("VACUUM")
            driver.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            raw.close()
    return {"jobs": pruned, "rows_deleted": sum(pruned.values()), "file_bytes_before": before,
            "file_bytes_after": database_file_bytes(session)}


PRUNE_PERIOD_S = 24 * 3600.0


def prune_periodically(stop: Any) -> None:
    """Until ``stop`` (a threading.Event): at the worker's start and then daily, drop the detail of finished
    jobs older than PIPEBOARD_DETAIL_RETENTION_DAYS (0: never). Several workers doing it is harmless."""
    import logging

    from pipeboard.app.core.config import get_settings
    from pipeboard.app.core.db import get_sessionmaker

    log = logging.getLogger(__name__)
    while True:
        days = get_settings().detail_retention_days
        if days > 0:
            try:
                with get_sessionmaker()() as session:
                    result = prune(session, days)
                if result["rows_deleted"]:
                    log.info("dropped the detail of %d finished jobs older than %s days (%d rows)",
                             len(result["jobs"]), days, result["rows_deleted"])
            except Exception as exc:  # a busy database must not end the thread; the next day tries again
                log.warning("pruning finished jobs' detail failed: %s", exc)
        if stop.wait(PRUNE_PERIOD_S):
            return
