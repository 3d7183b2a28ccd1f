"""The job event log, SSE framing, DbSink and the stream's catch-up/resume/end behaviour."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
import json
import threading
import time

import pytest
from sqlalchemy import select

from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import Job, JobStatus, MetricPoint
from pipeboard.app.models import TimelineEvent as TimelineEventRow
from pipeboard.app.services import events, jobs, rundata, stream
from pipeboard.app.services.run_sink import DbSink, Superseded
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

    # in a thread of its own: a test process that ran the browser tests before this file (make
    # test's processes take files in any order) keeps playwright's event loop running here
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()


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
        job = s.get(Job, job_id)
        assert job.summary == {"samples_per_s": 123.0, "final_metric": None, "attempt": job.attempt}
        log = events.since(s, job_id, 0)
    assert [e["event"] for e in log] == ["progress", "timeline", "timeline", "metrics", "summary"]
    assert log[1]["data"]["events"][3] == [0, 0, 0, 3, "F", 0.3, 0.35, 0] and log[2]["data"]["first_seq"] == 5


def test_a_resumed_attempt_continues_the_data_and_the_old_one_is_fenced_off(live_db):
    job_id = new_job("running")
    first = DbSink(job_id, own_group=False)
    first.on_status("running", start_step=0, hosts={0: "a", 1: "b"})
    first.on_events([TimelineEvent(w, w, 0, 0, "F", 0.1 * k, 0.1 * k + 0.05, step=k) for k in range(3) for w in (0, 1)])
    first.on_metrics([MetricRecord(step=k + 1, wall_s=0.1 * k + 0.1, values={"loss": 3.0 - k}) for k in range(3)])
    with get_sessionmaker()() as s:  # its worker is lost: the job moves on to the next attempt
        job = s.get(Job, job_id)
        assert jobs.fail_or_retry(s, job_id, job.attempt, "lost", retryable=True)
        s.execute(Job.__table__.update().where(Job.id == job_id).values(status=JobStatus.RUNNING))
        s.commit()
        attempt = s.get(Job, job_id).attempt
    with pytest.raises(Superseded, match=f"moved on to attempt {attempt}"):
        first.on_metrics([MetricRecord(step=4, wall_s=0.4, values={"loss": 0.5})])
    resumed = DbSink(job_id, own_group=False)  # resumes from the checkpoint at step 1
    assert resumed.attempt == attempt and resumed.offset_s >= 0
    resumed.on_status("running", start_step=1, hosts={0: "b", 1: "a"})
    resumed.on_events([TimelineEvent(0, 0, 0, 0, "F", 0.0, 0.05, step=1)])
    resumed.on_metrics([MetricRecord(step=2, wall_s=0.1, values={"loss": 2.0})])
    with get_sessionmaker()() as s:
        points = s.execute(select(MetricPoint.step, MetricPoint.attempt).where(MetricPoint.job_id == job_id)
                           .order_by(MetricPoint.step)).all()
        assert [tuple(p) for p in points] == [(1, attempt - 1), (2, attempt)]  # step 2 once, step 4 never
        timeline = rundata.timeline(s, job_id)
        log = events.since(s, job_id, 0)
    assert [(e.step, e.attempt, e.worker, e.host) for e in timeline.events] == [(0, attempt - 1, 0, "a"), (0, attempt - 1, 1, "b"),
                                                                                (1, attempt, 0, "b")]
    assert timeline.events[-1].start == pytest.approx(resumed.offset_s)  # on the job's clock
    marks = [e["data"] for e in log if e["event"] == "attempt"]
    assert [(m["attempt"], m["resume_step"]) for m in marks] == [(attempt - 1, 0), (attempt, 1)]
    assert marks[-1]["message"] == f"attempt {attempt} trains from the checkpoint at step 1 on a, b"


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
