"""The live event stream of one job, as SSE text: catch up from the database, then follow.

- Redis broker: subscribe to the job's channel FIRST, then read the database from the client's
  Last-Event-ID, then serve messages as they are published; a message whose seq skips ahead
  (one was missed) triggers another database catch-up, so nothing is lost or repeated.
- Embedded broker: tail the database (a cheap indexed query every POLL_S).
The stream ends after the job's terminal `end` event. Short sessions per read: a long-lived
transaction would pin SQLite's WAL and show a stale snapshot on PostgreSQL.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

from sqlalchemy import select

from app.core.db import get_sessionmaker
from app.models import Job, JobStatus
from app.services import events, jobs
from app.services.sse import comment, frame

log = logging.getLogger(__name__)

POLL_S = 0.1
KEEPALIVE_S = 15.0
REAP_EVERY_S = 2.0
RETRY_MS = 1000


class _Cursor:
    """Tracks the last seq sent and turns log rows into SSE frames; ``ended`` after `end`."""

    def __init__(self, job_id: int, last_seq: int) -> None:
        self.job_id = job_id
        self.last = last_seq
        self.ended = False
        self.sent_at = time.monotonic()

    def emit(self, ev: dict[str, Any]) -> str | None:
        if ev["seq"] <= self.last or self.ended:
            return None
        self.last = ev["seq"]
        self.sent_at = time.monotonic()
        if ev["event"] == events.END_EVENT:
            self.ended = True
        return frame(ev["data"], event=ev["event"], id=ev["seq"])

    def catch_up(self) -> Iterator[str]:
        while not self.ended:
            with get_sessionmaker()() as s:
                batch = events.since(s, self.job_id, self.last, limit=500)
            if not batch:
                return
            for ev in batch:
                out = self.emit(ev)
                if out:
                    yield out


def job_exists(job_id: int) -> bool:
    with get_sessionmaker()() as s:
        return s.get(Job, job_id) is not None


def _final_without_more(cursor: _Cursor) -> str | None:
    """A job already final whose log the client has fully read (e.g. resumed after its end):
    repeat the end so the client stops instead of waiting forever."""
    with get_sessionmaker()() as s:
        jobs.reap_stale(s)
        status = s.scalar(select(Job.status).where(Job.id == cursor.job_id))
        if status is None or not status.is_final:
            return None
        if events.since(s, cursor.job_id, cursor.last, limit=1):
            return None
    cursor.ended = True
    return frame({"status": status.value, "message": "job already finished"}, event=events.END_EVENT, id=cursor.last)


def stream(job_id: int, last_event_id: int = 0) -> Iterator[str]:
    cursor = _Cursor(job_id, last_event_id)
    yield frame({"job_id": job_id, "resume_from": last_event_id}, event="open", retry_ms=RETRY_MS)
    url = events.redis_url()
    if url:
        try:
            yield from _follow_redis(cursor, url)
            return
        except Exception as exc:  # Redis gone: the database still has everything
            log.warning("job %s stream: Redis failed (%s); tailing the database", job_id, exc)
    yield from _follow_database(cursor)


def _housekeeping(cursor: _Cursor, state: dict[str, float]) -> Iterator[str]:
    now = time.monotonic()
    if now - state["reap"] >= REAP_EVERY_S:
        state["reap"] = now
        end = _final_without_more(cursor)
        if end:
            yield end
            return
    if now - cursor.sent_at >= KEEPALIVE_S:
        cursor.sent_at = now
        yield comment("keep-alive")


def _follow_database(cursor: _Cursor) -> Iterator[str]:
    state = {"reap": 0.0}
    while not cursor.ended:
        sent = False
        for out in cursor.catch_up():
            sent = True
            yield out
        if cursor.ended:
            return
        if not sent:
            yield from _housekeeping(cursor, state)
            if not cursor.ended:
                time.sleep(POLL_S)


def _follow_redis(cursor: _Cursor, url: str) -> Iterator[str]:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(events.channel(cursor.job_id))
    state = {"reap": 0.0}
    try:
        yield from cursor.catch_up()  # after subscribing: anything committed meanwhile is in one of the two
        while not cursor.ended:
            message = pubsub.get_message(timeout=0.5)
            if message is None:
                # Quiet: cover a publish that failed (the database is authoritative).
                yield from cursor.catch_up()
                if not cursor.ended:
                    yield from _housekeeping(cursor, state)
                continue
            ev = json.loads(message["data"])
            if ev["seq"] > cursor.last + 1:
                yield from cursor.catch_up()  # a gap: read the missing rows first
            out = cursor.emit(ev)
            if out:
                yield out
    finally:
        try:
            pubsub.close()
            client.close()
        except Exception:
            pass
