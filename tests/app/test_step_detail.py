"""Step summaries and detail windows through the service: DbSink, /steps, /detail.

On SQLite and, where PIPEBOARD_TEST_POSTGRES_URL answers, PostgreSQL (the live_db fixture)."""

from __future__ import annotations

from sqlalchemy import func, select

from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import Job, JobStatus, MetricPoint
from pipeboard.app.models import TimelineEvent as TimelineEventRow
from pipeboard.app.services import events, rundata
from pipeboard.app.services.run_sink import DETAIL_REQUEST, DbSink
from pipeboard.trainer.runtime.detail import SUMMARY_COLUMNS, DetailPolicy
from pipeboard.trainer.runtime.report import Reporter
from tests.app.test_services_support import live_db, new_job  # noqa: F401  (fixture)
from tests.trainer.test_detail_windows import WORLD, ready, step


def test_a_window_requested_while_the_job_runs_reaches_the_run_through_the_job_log(live_db):
    job_id = new_job("running")
    sink = DbSink(job_id, own_group=False)
    reporter = Reporter(sink, WORLD, batch_size=8, metric_name="accuracy", flush_s=0.0,
                        detail=DetailPolicy(first=2, every=0, before_failure=0))
    for rank in range(WORLD):
        reporter.handle(ready(rank))
    for k in range(30):
        if k == 12:  # the job page's "record the next 5 steps"
            with get_sessionmaker()() as s:
                events.append(s, job_id, [(DETAIL_REQUEST, {"steps": 5})])
        for rank in range(WORLD):
            reporter.handle(step(rank, k))
    reporter.maybe_flush(force=True)
    sink.close()
    with get_sessionmaker()() as s:
        detail = set(s.scalars(select(TimelineEventRow.step).where(TimelineEventRow.job_id == job_id).distinct()))
        summaries = rundata.step_summaries(s, job_id)
        trace = rundata.chrome_trace(s, job_id)
        window = rundata.chrome_trace(s, job_id, step_from=12, step_to=16)
        metric_points = s.scalar(select(func.count()).select_from(MetricPoint).where(MetricPoint.job_id == job_id))
    # the request is read at the next flush (after step 11's reports): it covers the 5 steps after the last completed one
    assert detail == {0, 1} | set(range(12, 17))
    assert summaries["step"] == list(range(1, 31)) and metric_points == 30
    assert summaries["columns"] == list(SUMMARY_COLUMNS)
    assert len(summaries["stages"][5]) == WORLD and summaries["stages"][5][0][0] == 0.006
    assert summaries["detail_steps"] == [[0, 1], [12, 16]]
    assert trace["otherData"]["detail_steps"] == "0-1, 12-16"  # the trace says which steps have actions
    assert {e["args"]["step"] for e in window["traceEvents"] if e["ph"] == "X"} == set(range(12, 17))


def test_the_metric_series_leaves_the_summary_to_steps(live_db):
    job_id = new_job("running")
    sink = DbSink(job_id, own_group=False)
    reporter = Reporter(sink, WORLD, batch_size=8, metric_name="accuracy", flush_s=0.0, detail=DetailPolicy(first=0, every=0))
    for rank in range(WORLD):
        reporter.handle(ready(rank))
        reporter.handle(step(rank, 0))
    reporter.maybe_flush(force=True)
    sink.close()
    with get_sessionmaker()() as s:
        points = rundata.metrics(s, job_id).points
    assert points and all("stages" not in p.values for p in points) and "loss" in points[0].values


def test_detail_can_be_requested_of_a_running_job_only(client, session, make_token):
    admin = {"Authorization": f"Bearer {make_token('admin', 'suite-admin')}"}  # the jobs below have no owner
    running = Job(name="r", spec={}, status=JobStatus.RUNNING)
    done = Job(name="d", spec={}, status=JobStatus.SUCCEEDED)
    session.add_all([running, done])
    session.commit()
    answer = client.post(f"/api/v1/jobs/{running.id}/detail", json={"steps": 20}, headers=admin)
    assert answer.status_code == 202 and answer.json()["steps"] == 20
    logged = events.since(session, running.id, 0)
    assert [(e["event"], e["data"]) for e in logged] == [(DETAIL_REQUEST, {"steps": 20})]
    refused = client.post(f"/api/v1/jobs/{done.id}/detail", json={"steps": 20}, headers=admin)
    assert refused.status_code == 409 and "only a running job" in refused.text
    too_many = client.post(f"/api/v1/jobs/{running.id}/detail", json={"steps": 100_000}, headers=admin)
    assert too_many.status_code == 422 and "steps" in too_many.text
    assert client.get(f"/api/v1/jobs/{running.id}/steps", headers=admin).json()["step"] == []


def test_a_request_reaches_the_run_through_the_background_writer_as_launched(live_db):
    """The chain `pipeboard train --job-id` reports through: MultiSink(BackgroundSink(DbSink)); the writer
    thread reads the request, the reporter picks it up at its next flush."""
    import time

    from pipeboard.trainer.runtime.sinks import MultiSink
    from pipeboard.trainer.sink import BackgroundSink, ListSink

    job_id = new_job("running")
    background = BackgroundSink(DbSink(job_id, own_group=False), period_s=0.02)
    reporter = Reporter(MultiSink([ListSink(), background]), WORLD, batch_size=8, metric_name="accuracy", flush_s=0.0,
                        detail=DetailPolicy(first=2, every=0, before_failure=0))
    for rank in range(WORLD):
        reporter.handle(ready(rank))
    for k in range(200):
        if k == 20:  # asked while it runs, well after its opening window
            with get_sessionmaker()() as s:
                events.append(s, job_id, [(DETAIL_REQUEST, {"steps": 5})])
        for rank in range(WORLD):
            reporter.handle(step(rank, k))
        time.sleep(0.01)
    reporter.maybe_flush(force=True)
    background.close()
    with get_sessionmaker()() as s:
        windows = rundata.step_summaries(s, job_id)["detail_steps"]
    assert windows[0] == [0, 1] and len(windows) == 2 and windows[1][0] >= 20 and windows[1][1] - windows[1][0] == 4, windows


def test_the_detail_settings_reach_a_sandboxed_run():
    """Training runs in the sandbox, whose environment loses the server's settings: the detail
    windows' settings are the run's own and stay (a day-long job's budget is set this way)."""
    from pipeboard.app.services.sandbox import inner_env
    from pipeboard.trainer.runtime.detail import DetailPolicy

    names = ["FIRST_STEPS", "EVERY", "WIDTH", "MAX_WINDOWS", "BEFORE_FAILURE", "MAX_QUEUED"]
    env = {f"PIPEBOARD_DETAIL_{n}": str(i + 7) for i, n in enumerate(names)}
    inner = inner_env({**env, "PIPEBOARD_DATABASE_URL": "sqlite:///x", "PIPEBOARD_DETAIL_RETENTION_DAYS": "3"})
    assert {k: v for k, v in inner.items() if k.startswith("PIPEBOARD_")} == env  # the server's own stay out
    policy = DetailPolicy.from_env(inner)
    assert (policy.first, policy.every, policy.width, policy.max_periodic, policy.before_failure, policy.max_queued) == (7, 8, 9, 10, 11, 12)
