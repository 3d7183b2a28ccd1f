"""The job event log, SSE framing, DbSink and the stream's catch-up/resume/end behaviour."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from sqlalchemy import select

from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import Job, JobStatus, MetricPoint
from pipeboard.app.models import TimelineEvent as TimelineEventRow
from pipeboard.app.services import events, jobs, stream
from pipeboard.app.services.run_sink import DbSink
from pipeboard.app.services.sse import frame, parse_stream
from tests.app.test_services_support import live_db, new_job  # noqa: F401  (fixture)
from pipeboard.trainer.schedule.actions import Kind, TimelineEvent
from pipeboard.trainer.sink import MetricRecord


def parse(chunks: list[str]) -> list[dict]:
    return list(parse_stream("".join(chunks).split("\n")))


def collect(job_id: int, last: int) -> list[str]:
    """Run the (async) stream to its end, as the server would."""

    async def run() -> list[str]:
        return [chunk async for chunk in stream.stream(job_id, last)]

    return asyncio.run(run())


def test_frame_round_trips_through_the_parser():
    text = frame({"a": "line1\nline2"}, event="progress", id=7, retry_ms=500) + frame("plain\ntext", id=8)
    parsed = list(parse_stream(text.split("\n")))
    assert parsed[0]["id"] == "7" and parsed[0]["event"] == "progress" and json.loads(parsed[0]["data"]) == {"a": "line1\nline2"}
    assert parsed[1]["data"] == "plain\ntext"


def test_concurrent_appends_get_distinct_consecutive_seqs(live_db):
    job_id = new_job()

    def writer(n: int) -> None:
        for i in range(n):
            with get_sessionmaker()() as s:
                events.append(s, job_id, [("progress", {"i": i}), ("progress", {"i": i})])

    threads = [threading.Thread(target=writer, args=(10,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with get_sessionmaker()() as s:
        seqs = [e["seq"] for e in events.since(s, job_id, 0)]
    assert seqs == list(range(1, 61))


def test_dbsink_writes_rows_and_announces_them(live_db):
    job_id = new_job("running")
    sink = DbSink(job_id, own_group=False)
    sink.on_status("running", "step 1", step=1)
    sink.on_events([TimelineEvent(0, 0, 0, m, "F", m * 0.1, m * 0.1 + 0.05, step=0) for m in range(4)])
    sink.on_events([TimelineEvent(1, 1, 0, 0, Kind.BACKWARD, 0.5, 0.6, step=1)])
    sink.on_metrics([MetricRecord(step=1, wall_s=0.7, epoch=0.1, values={"loss": 2.0, "samples_per_s": 100.0})])
    sink.on_summary({"samples_per_s": 123.0, "final_metric": float("nan")})
    sink.close()
    with get_sessionmaker()() as s:
        rows = s.scalars(select(TimelineEventRow).where(TimelineEventRow.job_id == job_id).order_by(TimelineEventRow.seq)).all()
        assert [r.seq for r in rows] == [1, 2, 3, 4, 5] and rows[-1].kind == "B"
        assert s.scalar(select(MetricPoint.values).where(MetricPoint.job_id == job_id)) == {"loss": 2.0, "samples_per_s": 100.0}
        assert s.get(Job, job_id).summary == {"samples_per_s": 123.0, "final_metric": None}
        log = events.since(s, job_id, 0)
    assert [e["event"] for e in log] == ["progress", "timeline", "timeline", "metrics", "summary"]
    assert log[1]["data"]["events"][3] == [0, 0, 0, 3, "F", 0.3, 0.35, 0] and log[2]["data"]["first_seq"] == 5
    # a second sink for the same job (a resumed run) continues the sequence
    DbSink(job_id, own_group=False).on_events([TimelineEvent(0, 0, 0, 0, "F", 1.0, 1.1, step=2)])
    with get_sessionmaker()() as s:
        assert s.scalar(select(TimelineEventRow.seq).order_by(TimelineEventRow.seq.desc()).limit(1)) == 6


def test_stream_catches_up_follows_and_ends(live_db):
    job_id = new_job("running")
    with get_sessionmaker()() as s:
        events.append(s, job_id, [("progress", {"n": 1}), ("progress", {"n": 2})])
    chunks: list[str] = []

    def consume() -> None:
        chunks.extend(collect(job_id, 0))

    reader = threading.Thread(target=consume)
    reader.start()
    time.sleep(0.3)
    with get_sessionmaker()() as s:
        events.append(s, job_id, [("progress", {"n": 3})])
        jobs.finish(s, job_id, JobStatus.SUCCEEDED, expected=(JobStatus.RUNNING,))
    reader.join(timeout=10)
    assert not reader.is_alive()
    got = parse(chunks)
    assert got[0]["event"] == "open"
    assert [m["id"] for m in got[1:]] == ["1", "2", "3", "4", "5"]
    assert [m["event"] for m in got[-2:]] == ["status", "end"]


def test_stream_resumes_after_last_event_id_and_ends_for_finished_jobs(live_db):
    job_id = new_job("running")
    with get_sessionmaker()() as s:
        events.append(s, job_id, [("progress", {"n": i}) for i in range(5)])
        jobs.finish(s, job_id, JobStatus.FAILED, expected=(JobStatus.RUNNING,), error="boom")
    resumed = parse(collect(job_id, 3))
    assert [m["id"] for m in resumed[1:]] == ["4", "5", "6", "7"]
    assert json.loads(resumed[-1]["data"])["error"] == "boom"
    # reconnecting after the end: one `end` again, then the stream closes
    after_end = parse(collect(job_id, 7))
    assert [m["event"] for m in after_end] == ["open", "end"]
