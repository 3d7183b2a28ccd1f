"""`DbSink(job_id)`: the `pipeboard.trainer.sink.Sink` that `pipeboard train --job-id N` reports through.

Each call is one transaction: the rows (timeline events or metric points, inserted with one
executemany) and the job-log event announcing them (their seq range only: events.py puts the rows
back when the log is read) commit together, then go out on Redis pub/sub, rows included, when the
broker is Redis. Calls already arrive in batches (rank 0 gathers the others'),
so one transaction per call keeps the write rate low.

It also fences its attempt: every write checks, under the job row's lock, that the job still runs
this attempt; when it does not (cancelled, or failed or retried because its worker was lost), the
write is dropped and, for a run the service started as its own process group, the group is ended,
so a run whose worker vanished can neither go on training unobserved nor write into the next attempt.
Times are shifted onto the job's clock (attempts.clock_offset), so a resumed attempt continues it.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import replace
from enum import Enum
from typing import Any, Sequence

from sqlalchemy import func, insert, select, update

from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import EventSource, Job, JobEvent, JobStatus, MetricPoint
from pipeboard.app.models import TimelineEvent as TimelineEventRow
from pipeboard.app.services import attempts
from pipeboard.app.services import events as job_events
from pipeboard.app.services.tx import begin_write
from pipeboard.trainer.sink import MetricRecord
from pipeboard.trainer.schedule.actions import TimelineEvent

log = logging.getLogger(__name__)

INLINE_EVENTS = job_events.INLINE_EVENTS
# The job-log event kind the job page's "record the next N steps" appends; the running job reads it.
DETAIL_REQUEST = "detail_request"


def compact(ev: TimelineEvent) -> list[Any]:
    """[worker, stage, replica, microbatch, kind, start, end, step]: the SSE wire form."""
    return job_events.compact_action(ev.worker, ev.stage, ev.replica, ev.microbatch, _kind(ev.kind), ev.start, ev.end, ev.step)


def _kind(kind: Any) -> str:
    # A Kind member or its value; str() of a (str, Enum) member is "Kind.FORWARD" on 3.11.
    return kind.value if isinstance(kind, Enum) else str(kind)


class Superseded(RuntimeError):
    """The job is no longer running this attempt (cancelled, failed, or retried as a next one)."""


class DbSink:
    """Reports of attempt ``attempt`` (default: the job's current one) of job ``job_id``."""

    def __init__(self, job_id: int, *, attempt: int | None = None, own_group: bool | None = None) -> None:
        self.job_id = int(job_id)
        self.session = get_sessionmaker()()
        job = self.session.get(Job, self.job_id)
        if job is None:
            raise ValueError(f"--job-id: job {self.job_id} does not exist in the configured database")
        self.attempt = int(attempt if attempt is not None else job.attempt)
        self._timeline_seq = self._max_seq(TimelineEventRow.seq, TimelineEventRow.source == EventSource.MEASURED)
        self._metric_seq = self._max_seq(MetricPoint.seq)
        self._request_seq = job_events.last_seq(self.session, self.job_id)  # requests before this run are not for it
        self._own_group = os.environ.get("PIPEBOARD_RUN_GROUP") == "1" if own_group is None else own_group
        self.session.commit()  # end the reads above: the first write must start a fresh transaction
        begin_write(self.session)
        # The attempt's clock continues the job's: its times are shifted by this much.
        self.offset_s = attempts.clock_offset(self.session, self.job_id, self.attempt)
        self.session.commit()

    def _max_seq(self, column: Any, *where: Any) -> int:
        table = column.class_
        return self.session.scalar(select(func.coalesce(func.max(column), 0)).where(table.job_id == self.job_id, *where)) or 0

    # --- Sink -----------------------------------------------------------------------------

    def on_status(self, phase: str, message: str = "", **fields: Any) -> None:
        payload = {"phase": phase, "message": message, **_jsonable(fields)}
        items = [("progress", payload)]
        if phase == "running" and "start_step" in fields:  # where this attempt's training starts
            items.append(("attempt", attempts.resumed(self.session, self.job_id, self.attempt, int(fields["start_step"]),
                                                      fields.get("hosts"))))
        self._commit_with(items)

    def on_events(self, events: Sequence[TimelineEvent]) -> None:
        if not events:
            return
        shift = self.offset_s
        events = [replace(e, start=float(e.start) + shift, end=float(e.end) + shift) for e in events]
        first = self._timeline_seq + 1
        rows = [
            {"job_id": self.job_id, "source": EventSource.MEASURED, "seq": first + i, "worker": e.worker, "stage": e.stage,
             "replica": e.replica, "microbatch": e.microbatch, "kind": _kind(e.kind), "start": e.start, "end": e.end,
             "step": e.step, "attempt": self.attempt}
            for i, e in enumerate(events)
        ]
        self.session.execute(insert(TimelineEventRow), rows)
        payload: dict[str, Any] = {
            "first_seq": first,
            "last_seq": first + len(rows) - 1,
            "count": len(rows),
            "steps": [min(e.step for e in events), max(e.step for e in events)],
            "attempt": self.attempt,
        }
        # the log keeps the range; the live message also carries the actions
        inline = {"events": [compact(e) for e in events]} if len(events) <= INLINE_EVENTS else {}
        self._commit_with([("timeline", payload)], [inline])
        self._timeline_seq = first + len(rows) - 1

    def on_metrics(self, records: Sequence[MetricRecord]) -> None:
        if not records:
            return
        first = self._metric_seq + 1
        rows = [
            {"job_id": self.job_id, "seq": first + i, "step": r.step, "wall_s": float(r.wall_s) + self.offset_s,
             "epoch": float(r.epoch), "values": _values(r.values), "attempt": self.attempt}
            for i, r in enumerate(records)
        ]
        self.session.execute(insert(MetricPoint), rows)
        points = [job_events.metric_point(row["seq"], row["step"], row["wall_s"], row["epoch"], row["values"], self.attempt) for row in rows]
        ref = {"first_seq": first, "last_seq": first + len(rows) - 1, "count": len(rows),
               "steps": [min(r.step for r in records), max(r.step for r in records)], "attempt": self.attempt}
        self._commit_with([("metrics", ref)], [{"points": points}])
        self._metric_seq = first + len(rows) - 1

    def on_summary(self, summary: dict[str, Any]) -> None:
        clean = {**_jsonable(summary), "attempt": self.attempt}
        self.session.execute(update(Job).where(Job.id == self.job_id).values(summary=clean))
        self._commit_with([("summary", clean)])

    def detail_requested(self) -> int:
        """Steps of detail asked for since the last call: ``detail_request`` events in the job's log
        (``POST /jobs/{id}/detail`` appends them), read at each of the reporter's flushes."""
        rows = self.session.execute(select(JobEvent.seq, JobEvent.payload).where(
            JobEvent.job_id == self.job_id, JobEvent.kind == DETAIL_REQUEST, JobEvent.seq > self._request_seq)).all()
        self.session.commit()
        if not rows:
            return 0
        self._request_seq = max(seq for seq, _ in rows)
        return max(int((payload or {}).get("steps", 0)) for _, payload in rows)

    def close(self) -> None:
        self.session.close()

    # --- internals ------------------------------------------------------------------------

    def _commit_with(self, items: list[tuple[str, dict[str, Any]]], live: list[dict[str, Any]] | None = None) -> None:
        """Commit the pending rows with their log events, if the job still runs this attempt:
        the check happens under the job row's lock (taken by the append), so a run that outlived
        its attempt (its worker was lost and the job moved on) can never write into the next.
        ``live``: per item, what its published message carries beyond its stored payload."""
        try:
            published = job_events.append(self.session, self.job_id, items, commit=False)
            status, attempt = self.session.execute(select(Job.status, Job.attempt).where(Job.id == self.job_id)).one()
            if status != JobStatus.RUNNING or attempt != self.attempt:
                self.session.rollback()
                self._superseded(status, attempt)
            self.session.commit()
        except Exception:
            self.session.rollback()
            raise
        for message, extra in zip(published, live or []):
            message["data"] = {**message["data"], **extra}
        job_events.publish(self.job_id, published)

    def _superseded(self, status: JobStatus, attempt: int) -> None:
        what = f"is {status.value}" if attempt == self.attempt else f"moved on to attempt {attempt}"
        message = f"job {self.job_id} {what}; attempt {self.attempt}'s run stops"
        log.warning(message)
        if self._own_group:
            os.killpg(os.getpgrp(), signal.SIGTERM)
        raise Superseded(message)


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


def _values(values: dict[str, Any]) -> dict[str, Any]:
    """A metric point's numbers as floats; the step summary (``stages``: rows of numbers) as it is."""
    return {k: [[float(x) for x in row] for row in v] if k == "stages" else float(v) for k, v in values.items()}
