"""A long job's reads and its event log stay bounded: the log holds a batch's seq range, not its
points, and the stream puts them back; the metric series is thinned by key; `/detail` says which steps have
actions without reading any summary.

On SQLite and, where PIPEBOARD_TEST_POSTGRES_URL answers, PostgreSQL (the live_db fixture)."""

from __future__ import annotations

from sqlalchemy import select

from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import Job, JobStatus, MetricPoint
from pipeboard.app.services import events, rundata, storage
from pipeboard.app.services.run_sink import DbSink
from pipeboard.trainer.schedule.actions import TimelineEvent
from pipeboard.trainer.sink import MetricRecord
from tests.app.test_services_support import live_db, new_job  # noqa: F401  (fixture)

STAGES = [[0.01, 0.002, 0.001, 0.0005, 1e6, 0.001, 0.002, 0.0, 0.0]] * 4


def run(batches: int, per_batch: int) -> int:
    """A running job whose run reports ``batches`` flushes of ``per_batch`` steps, a window of actions in the first."""
    job_id = new_job("running")
    sink = DbSink(job_id, own_group=False)
    sink.on_events([TimelineEvent(w, w, 0, m, "F", m * 0.1 + w, m * 0.1 + w + 0.05, step=0) for w in (0, 1) for m in range(3)])
    for b in range(batches):
        sink.on_metrics([MetricRecord(step=b * per_batch + k, wall_s=0.01 * (b * per_batch + k),
                                      values={"loss": 2.0, "samples_per_s": 100.0 + k, "stages": STAGES})
                         for k in range(per_batch)])
    sink.close()
    return job_id


def test_the_job_log_does_not_grow_with_the_steps_and_the_stream_still_carries_them(live_db):
    few, many = run(5, 2), run(5, 200)
    with get_sessionmaker()() as s:
        small, big = storage.usage(s, few)["tables"], storage.usage(s, many)["tables"]
        logged = events.since(s, many, 0)
        stored = s.execute(select(MetricPoint.seq, MetricPoint.step, MetricPoint.values).where(MetricPoint.job_id == many)
                           .order_by(MetricPoint.seq)).all()
    # 100 times the steps, the same rows; the bytes differ only in the digits of the seq ranges
    assert big["job_events"]["rows"] == small["job_events"]["rows"] == 6
    assert big["job_events"]["bytes"] < small["job_events"]["bytes"] + 100
    assert big["metric_points"]["rows"] == 1000 and big["job_events"]["bytes"] < big["metric_points"]["bytes"] / 50
    # what the stream (and the CLI's `jobs watch`) reads is what was reported, point for point
    points = [p for e in logged if e["event"] == "metrics" for p in e["data"]["points"]]
    assert [(p["seq"], p["step"], p["values"]) for p in points] == [tuple(r) for r in stored]
    actions = next(e["data"] for e in logged if e["event"] == "timeline")
    assert actions["count"] == 6 and actions["events"][0] == [0, 0, 0, 0, "F", 0.0, 0.05, 0]


def test_the_metric_series_is_thinned_by_key_to_its_limit(live_db):
    job_id = run(4, 250)
    with get_sessionmaker()() as s:
        for limit in (1, 2, 7, 10, 999, 1000, 5000):
            page = rundata.metrics(s, job_id, limit=limit)
            steps = [p.step for p in page.points]
            assert page.total == 1000 and len(steps) <= limit and steps[-1] == 999, (limit, len(steps))
            assert page.downsampled == (limit < 1000) and steps == sorted(steps)
            if 1 < limit < 1000:  # evenly spread: no gap wider than twice the even one
                assert len(steps) >= limit // 2 and max(b - a for a, b in zip(steps, steps[1:])) <= 2 * 1000 / (limit - 1) + 1


def test_detail_names_the_windows_and_the_last_step(client, session, make_token):
    admin = {"Authorization": f"Bearer {make_token('admin', 'suite-admin')}"}
    job = Job(name="r", spec={}, status=JobStatus.SUCCEEDED)
    session.add(job)
    session.commit()
    empty = client.get(f"/api/v1/jobs/{job.id}/detail", headers=admin)
    assert empty.status_code == 200 and empty.json() == {"job_id": job.id, "detail_steps": [], "last_step": None}
    session.add_all([MetricPoint(job_id=job.id, seq=k + 1, step=k, wall_s=0.1 * k, values={"loss": 1.0}) for k in range(30)])
    session.commit()
    assert client.get(f"/api/v1/jobs/{job.id}/detail", headers=admin).json()["last_step"] == 29
    assert client.get("/api/v1/jobs/999999/detail", headers=admin).status_code == 404
