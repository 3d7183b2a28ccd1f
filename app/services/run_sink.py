"""`DbSink(job_id)`: the `pipeboard.trainer.sink.Sink` that `pipeboard train --job-id N` reports through.

Each call is one transaction: the rows (timeline events or metric points, inserted with one
executemany) and the job-log event announcing them commit together, then go out on Redis
pub/sub when the broker is Redis. Calls already arrive in batches (rank 0 gathers the others'),
so one transaction per call keeps the write rate low.

It also watches its job: when the job is no longer running (cancelled, or failed by the reaper
because its worker died) and the run was started by the service as its own process group, it
ends that group, so a run whose worker vanished cannot go on training unobserved.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from enum import Enum
from typing import Any, Sequence

from sqlalchemy import func, insert, select, update

from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import EventSource, Job, JobStatus, MetricPoint
from pipeboard.app.models import TimelineEvent as TimelineEventRow
from pipeboard.app.services import events as job_events
from pipeboard.trainer.sink import MetricRecord
from pipeboard.trainer.schedule.actions import TimelineEvent

log = logging.getLogger(__name__)

# A timeline batch's events ride along in its SSE message up to this many; a bigger batch only
# announces its seq range and the client fetches /timeline (keeps the log and the stream small).
INLINE_EVENTS = 2000
WATCH_INTERVAL_S = 1.0


def compact(ev: TimelineEvent) -> list[Any]:
    """[worker, stage, replica, microbatch, kind, start, end, step]: the SSE wire form."""
    return [ev.worker, ev.stage, ev.replica, ev.microbatch, _kind(ev.kind), round(ev.start, 6), round(ev.end, 6), ev.step]


def _kind(kind: Any) -> str:
    # A Kind member or its value; str() of a (str, Enum) member is "Kind.FORWARD" on 3.11.
    return kind.value if isinstance(kind, Enum) else str(kind)


class DbSink:
    def __init__(self, job_id: int, *, own_group: bool | None = None) -> None:
        self.job_id = int(job_id)
        self.session = get_sessionmaker()()
        if self.session.get(Job, self.job_id) is None:
            raise ValueError(f"--job-id: job {self.job_id} does not exist in the configured database")
        self._timeline_seq = self._max_seq(TimelineEventRow.seq, TimelineEventRow.source == EventSource.MEASURED)
        self._metric_seq = self._max_seq(MetricPoint.seq)
        self._own_group = os.environ.get("PIPEBOARD_RUN_GROUP") == "1" if own_group is None else own_group
        self._last_watch = 0.0
        self.session.commit()  # end the reads above: the first write must start a fresh transaction

    def _max_seq(self, column: Any, *where: Any) -> int:
        table = column.class_
        return self.session.scalar(select(func.coalesce(func.max(column), 0)).where(table.job_id == self.job_id, *where)) or 0

    # --- Sink -----------------------------------------------------------------------------

    def on_status(self, phase: str, message: str = "", **fields: Any) -> None:
        payload = {"phase": phase, "message": message, **_jsonable(fields)}
        self._commit_with([("progress", payload)])

    def on_events(self, events: Sequence[TimelineEvent]) -> None:
        if not events:
            return
        first = self._timeline_seq + 1
        rows = [
            {"job_id": self.job_id, "source": EventSource.MEASURED, "seq": first + i, "worker": e.worker, "stage": e.stage,
             "replica": e.replica, "microbatch": e.microbatch, "kind": _kind(e.kind), "start": float(e.start), "end": float(e.end), "step": e.step}
            for i, e in enumerate(events)
        ]
        self.session.execute(insert(TimelineEventRow), rows)
        self._timeline_seq = first + len(rows) - 1
        payload: dict[str, Any] = {
            "first_seq": first,
            "last_seq": self._timeline_seq,
            "count": len(rows),
            "steps": [min(e.step for e in events), max(e.step for e in events)],
        }
        if len(events) <= INLINE_EVENTS:
            payload["events"] = [compact(e) for e in events]
        self._commit_with([("timeline", payload)])

    def on_metrics(self, records: Sequence[MetricRecord]) -> None:
        if not records:
            return
        first = self._metric_seq + 1
        rows = [
            {"job_id": self.job_id, "seq": first + i, "step": r.step, "wall_s": float(r.wall_s), "epoch": float(r.epoch),
             "values": {k: float(v) for k, v in r.values.items()}}
            for i, r in enumerate(records)
        ]
        self.session.execute(insert(MetricPoint), rows)
        self._metric_seq = first + len(rows) - 1
        points = [{"seq": row["seq"], "step": row["step"], "wall_s": row["wall_s"], "epoch": row["epoch"], "values": row["values"]} for row in rows]
        self._commit_with([("metrics", {"points": points})])

    def on_summary(self, summary: dict[str, Any]) -> None:
        clean = _jsonable(summary)
        self.session.execute(update(Job).where(Job.id == self.job_id).values(summary=clean))
        self._commit_with([("summary", clean)])

    def close(self) -> None:
        self.session.close()

    # --- internals ------------------------------------------------------------------------

    def _commit_with(self, items: list[tuple[str, dict[str, Any]]]) -> None:
        try:
            published = job_events.append(self.session, self.job_id, items, commit=False)
            self.session.commit()
        except Exception:
            self.session.rollback()
            raise
        job_events.publish(self.job_id, published)
        self._watch()

    def _watch(self) -> None:
        now = time.monotonic()
        if now - self._last_watch < WATCH_INTERVAL_S:
            return
        self._last_watch = now
        status = self.session.scalar(select(Job.status).where(Job.id == self.job_id))
        self.session.commit()
        if status in (JobStatus.CANCELLED, JobStatus.FAILED) and self._own_group:
            log.warning("job %s is %s; ending this run's process group", self.job_id, status.value)
            os.killpg(os.getpgrp(), signal.SIGTERM)


def _jsonable(value: Any) -> Any:
    """Summaries carry numpy scalars and tuples now and then; store plain JSON."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        if isinstance(value, float) and value != value:  # NaN is not JSON
            return None
        return value
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return str(value)
