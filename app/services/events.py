"""The per-job event log behind the SSE stream: append (with Redis fan-out) and read back.

Every status change, progress line, timeline batch and metric batch of a job is one `JobEvent`
row with a per-job `seq` (1, 2, 3, ...) that is the SSE `id`, so a client that reconnects with
`Last-Event-ID: n` gets exactly the rows with seq > n.

Several processes append to one job's log (the API on cancel, the Celery task, the training
process's sink), so seq is assigned under a lock on the job's row: a no-op UPDATE of the row
takes the row lock on PostgreSQL and the write lock on SQLite, then max(seq)+1 is safe and rows
become visible in seq order. When the broker is Redis, each committed row is also published on
the channel `pipeboard:job:<id>` for live streams; the database stays the source of truth.

A `metrics` or `timeline` batch's row holds only the seq range of the rows it announces
(`first_seq`, `last_seq`, `count`): the points and actions live once, in their own tables, so the
log grows by one small row a flush (the run flushes every half second), not by a copy of every
step. `since` puts them back (`points`; `events` for a batch of up to INLINE_EVENTS actions), so
the stream's messages are what they were.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Iterable

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from pipeboard.app.core.config import get_settings
from pipeboard.app.models import EventSource, Job, JobEvent, MetricPoint
from pipeboard.app.models import TimelineEvent as TimelineEventRow
from pipeboard.app.services.tx import begin_write

log = logging.getLogger(__name__)

TERMINAL = ("succeeded", "failed", "cancelled")
END_EVENT = "end"
# A timeline batch's actions ride along in its SSE message up to this many; a bigger batch only
# announces its seq range and the client fetches /timeline (keeps the stream's messages small).
INLINE_EVENTS = 2000


def compact_action(worker: int, stage: int, replica: int, microbatch: int, kind: str, start: float, end: float, step: int) -> list[Any]:
    """[worker, stage, replica, microbatch, kind, start, end, step]: an action's SSE wire form."""
    return [worker, stage, replica, microbatch, kind, round(start, 6), round(end, 6), step]


def metric_point(seq: int, step: int, wall_s: float, epoch: float, values: dict[str, Any], attempt: int) -> dict[str, Any]:
    """A metric point as a `metrics` message carries it."""
    return {"seq": seq, "step": step, "wall_s": wall_s, "epoch": epoch, "values": values, "attempt": attempt}


def channel(job_id: int) -> str:
    # KEY_PREFIX keeps deployments sharing one Redis apart (as it does the broker's keys).
    return f"{get_settings().key_prefix}pipeboard:job:{job_id}"


def redis_url() -> str | None:
    """The Redis URL for live pub/sub (the broker when it is Redis), or None on the embedded default."""
    url = get_settings().redis_url
    return url if url.startswith(("redis://", "rediss://")) else None


@lru_cache(maxsize=4)
def _redis_client(url: str):
    import redis

    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)


def _lock_job_row(session: Session, job_id: int) -> None:
    session.execute(update(Job).where(Job.id == job_id).values(id=Job.id))


def append(session: Session, job_id: int, items: Iterable[tuple[str, dict[str, Any]]], *, commit: bool = True) -> list[dict[str, Any]]:
    """Append events (type, payload) to a job's log; returns them as published ({seq, event, data}).

    With ``commit`` the rows are committed and then published; without it the caller commits
    (and should call `publish` afterwards).
    """
    items = list(items)
    if not items:
        return []
    if commit:  # standalone: nothing of the caller's is pending, so a stale read may be ended
        begin_write(session)
    _lock_job_row(session, job_id)
    last = session.scalar(select(func.coalesce(func.max(JobEvent.seq), 0)).where(JobEvent.job_id == job_id)) or 0
    now = datetime.now(timezone.utc)
    rows = [
        {"job_id": job_id, "seq": last + i + 1, "kind": kind, "payload": payload, "created_at": now}
        for i, (kind, payload) in enumerate(items)
    ]
    session.execute(insert(JobEvent), rows)
    out = [{"seq": r["seq"], "event": r["kind"], "data": r["payload"], "job_id": job_id} for r in rows]
    if commit:
        session.commit()
        publish(job_id, out)
    return out


def publish(job_id: int, events: list[dict[str, Any]]) -> None:
    """Best effort: a stream that misses a message catches up from the database."""
    url = redis_url()
    if not url or not events:
        return
    try:
        client = _redis_client(url)
        pipe = client.pipeline(transaction=False)
        for ev in events:
            pipe.publish(channel(job_id), json.dumps(ev, separators=(",", ":"), default=str))
        pipe.execute()
    except Exception as exc:  # the log in the database is authoritative; never fail a run for this
        log.warning("publishing job %s events to Redis failed: %s", job_id, exc)


def since(session: Session, job_id: int, after_seq: int, limit: int = 1000) -> list[dict[str, Any]]:
    rows = session.execute(
        select(JobEvent.seq, JobEvent.kind, JobEvent.payload)
        .where(JobEvent.job_id == job_id, JobEvent.seq > after_seq)
        .order_by(JobEvent.seq)
        .limit(limit)
    ).all()
    out = [{"seq": seq, "event": kind, "data": payload, "job_id": job_id} for seq, kind, payload in rows]
    _put_back(session, job_id, out)
    return out


def _by_seq(session: Session, refs: list[dict[str, Any]], table: Any, where: list[Any]) -> dict[int, Any]:
    """The rows of ``table`` in the seq ranges that ``refs`` announce, read at once, by seq."""
    if not refs:
        return {}
    lo, hi = min(r["first_seq"] for r in refs), max(r["last_seq"] for r in refs)
    return {row.seq: row for row in session.scalars(select(table).where(*where, table.seq >= lo, table.seq <= hi))}


def _put_back(session: Session, job_id: int, out: list[dict[str, Any]]) -> None:
    """Fill the `metrics` and `timeline` messages whose rows hold only a seq range with what it names.
    A range whose rows are gone (a finished job's detail dropped) is served as the range alone."""
    def refs(kind: str, has: str, most: int | None = None) -> list[dict[str, Any]]:
        return [ev["data"] for ev in out if ev["event"] == kind and isinstance(ev["data"], dict) and has not in ev["data"]
                and "first_seq" in ev["data"] and (most is None or ev["data"].get("count", 0) <= most)]

    metric_refs = refs("metrics", "points")
    points = _by_seq(session, metric_refs, MetricPoint, [MetricPoint.job_id == job_id])
    for data in metric_refs:
        data["points"] = [metric_point(r.seq, r.step, r.wall_s, r.epoch, r.values, r.attempt)
                          for s in range(data["first_seq"], data["last_seq"] + 1) if (r := points.get(s)) is not None]
    action_refs = refs("timeline", "events", INLINE_EVENTS)
    T = TimelineEventRow
    actions = _by_seq(session, action_refs, T, [T.job_id == job_id, T.source == EventSource.MEASURED])
    for data in action_refs:
        rows = [actions[s] for s in range(data["first_seq"], data["last_seq"] + 1) if s in actions]
        if len(rows) == data["count"]:
            data["events"] = [compact_action(r.worker, r.stage, r.replica, r.microbatch, r.kind, r.start, r.end, r.step) for r in rows]


def last_seq(session: Session, job_id: int) -> int:
    return session.scalar(select(func.coalesce(func.max(JobEvent.seq), 0)).where(JobEvent.job_id == job_id)) or 0
