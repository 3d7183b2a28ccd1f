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
from collections.abc import AsyncIterator
from typing import Any

import anyio
from sqlalchemy import select

from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import Job, JobStatus
from pipeboard.app.services import events, jobs
from pipeboard.app.services.sse import comment, frame

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

    def _read(self) -> list[dict[str, Any]]:
        with get_sessionmaker()() as s:
            return events.since(s, self.job_id, self.last, limit=500)

    async def catch_up(self) -> AsyncIterator[str]:
        while not self.ended:
            # Database calls run in the thread pool only for the query itself: a waiting stream
            # holds no thread, so many open dashboards cannot starve the API's sync routes.
            batch = await anyio.to_thread.run_sync(self._read)
            if not batch:
                return
            for ev in batch:
                out = self.emit(ev)
                if out:
                    yield out


def _final_without_more(cursor: _Cursor) -> str | None:
    """A job already final whose log the client has fully read (e.g. resumed after its end):
    repeat the end so the client stops instead of waiting forever. Also reaps stale jobs, so a
    stream watching a job whose worker died ends too."""
    with get_sessionmaker()() as s:
        jobs.reap_stale(s)
        status = s.scalar(select(Job.status).where(Job.id == cursor.job_id))
        if status is None or not status.is_final:
            return None
        if events.since(s, cursor.job_id, cursor.last, limit=1):
            return None
    return frame({"status": status.value, "message": "job already finished"}, event=events.END_EVENT, id=cursor.last)


async def stream(job_id: int, last_event_id: int = 0) -> AsyncIterator[str]:
    cursor = _Cursor(job_id, last_event_id)
    yield frame({"job_id": job_id, "resume_from": last_event_id}, event="open", retry_ms=RETRY_MS)
    url = events.redis_url()
    if url:
        try:
            async for out in _follow_redis(cursor, url):
                yield out
            return
        except Exception as exc:  # Redis gone: the database still has everything
            log.warning("job %s stream: Redis failed (%s); tailing the database", job_id, exc)
    async for out in _follow_database(cursor):
        yield out


async def _housekeeping(cursor: _Cursor, state: dict[str, float]) -> AsyncIterator[str]:
    now = time.monotonic()
    if now - state["reap"] >= REAP_EVERY_S:
        state["reap"] = now
        end = await anyio.to_thread.run_sync(_final_without_more, cursor)
        if end:
            cursor.ended = True
            yield end
            return
    if now - cursor.sent_at >= KEEPALIVE_S:
        cursor.sent_at = now
        yield comment("keep-alive")


async def _follow_database(cursor: _Cursor) -> AsyncIterator[str]:
    state = {"reap": 0.0}
    while not cursor.ended:
        sent = False
        async for out in cursor.catch_up():
            sent = True
            yield out
        if cursor.ended:
            return
        if not sent:
            async for out in _housekeeping(cursor, state):
                yield out
            if not cursor.ended:
                await anyio.sleep(POLL_S)


async def _follow_redis(cursor: _Cursor, url: str) -> AsyncIterator[str]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url, socket_connect_timeout=2)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(events.channel(cursor.job_id))
    state = {"reap": 0.0}
    try:
        async for out in cursor.catch_up():  # after subscribing: a commit meanwhile is in one of the two
            yield out
        while not cursor.ended:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
            if message is None:
                # Quiet: cover a publish that failed (the database is authoritative).
                async for out in cursor.catch_up():
                    yield out
                if not cursor.ended:
                    async for out in _housekeeping(cursor, state):
                        yield out
                continue
            ev = json.loads(message["data"])
            if ev["seq"] > cursor.last + 1:
                async for out in cursor.catch_up():  # a gap: read the missing rows first
                    yield out
            out = cursor.emit(ev)
            if out:
                yield out
    finally:
        try:
            await pubsub.aclose()
            await client.aclose()
        except Exception:
            pass
