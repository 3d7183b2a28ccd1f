"""A job's disk use, retention thinning finished jobs' detail, and reclaiming the disk.

On SQLite and, where PIPEBOARD_TEST_POSTGRES_URL answers, PostgreSQL (the live_db fixture)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from sqlalchemy import func, insert, select
from typer.testing import CliRunner

from pipeboard.app.cli import cli
from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import EventSource, Job, JobStatus, MetricPoint
from pipeboard.app.models import TimelineEvent as TimelineEventRow
from pipeboard.app.services import storage
from tests.app.test_services_support import live_db, new_job  # noqa: F401  (fixture)

STEPS, PER_STEP = 200, 24


def seeded(status: str, finished_days_ago: float | None) -> int:
    finished = None if finished_days_ago is None else datetime.now(timezone.utc) - timedelta(days=finished_days_ago)
    job_id = new_job(status, finished_at=finished)
    rows = [{"job_id": job_id, "source": EventSource.MEASURED, "seq": k * PER_STEP + i + 1, "worker": i % 4, "stage": i % 4,
             "replica": 0, "microbatch": i // 4, "kind": "F", "start": k + i * 0.01, "end": k + i * 0.01 + 0.005, "step": k,
             "attempt": 1} for k in range(STEPS) for i in range(PER_STEP)]
    points = [{"job_id": job_id, "seq": k + 1, "step": k + 1, "wall_s": float(k), "epoch": 0.0,
               "values": {"loss": 1.0, "stages": [[0.001, 0.0, 0.0, 0.0, 1024.0, 0.0005, 0.001, 0.0, 0.0]] * 4}, "attempt": 1}
              for k in range(STEPS)]
    with get_sessionmaker()() as s:
        s.execute(insert(TimelineEventRow), rows)
        s.execute(insert(MetricPoint), points)
        s.commit()
    return job_id


def detail_steps(job_id: int) -> set[int]:
    with get_sessionmaker()() as s:
        return set(s.scalars(select(TimelineEventRow.step).where(TimelineEventRow.job_id == job_id).distinct()))


def test_retention_thins_old_finished_jobs_only_and_keeps_their_summaries(live_db):
    old = seeded("succeeded", finished_days_ago=40)
    recent = seeded("failed", finished_days_ago=2)
    running = seeded("running", finished_days_ago=None)
    with get_sessionmaker()() as s:
        before = storage.usage(s, old)
        assert before["tables"]["timeline_events"]["rows"] == STEPS * PER_STEP and before["detail_steps"] == STEPS
        assert storage.prunable_jobs(s, 30) == [old]
        result = storage.prune(s, 30, keep_first_steps=10)
        after = storage.usage(s, old)
    assert result["jobs"] == {old: (STEPS - 10) * PER_STEP}
    assert detail_steps(old) == set(range(10))  # thinned: the opening window stays
    assert detail_steps(recent) == detail_steps(running) == set(range(STEPS))
    assert after["metric_points"] == STEPS and after["detail_steps"] == 10
    assert after["bytes"] < before["bytes"] and after["tables"]["metric_points"] == before["tables"]["metric_points"]


def test_dropping_detail_reclaims_the_disk_and_refuses_a_running_job(live_db):
    job_id = seeded("succeeded", finished_days_ago=100)
    running = seeded("running", finished_days_ago=None)
    with get_sessionmaker()() as s:
        try:
            storage.drop_detail(s, running)
            raise AssertionError("a running job's detail was dropped")
        except ValueError as exc:
            assert "only a finished job" in str(exc)
        file_before = storage.database_file_bytes(s)
        result = storage.prune(s, 30, vacuum=True)
        remaining = s.scalar(select(func.count()).select_from(TimelineEventRow).where(TimelineEventRow.job_id == job_id))
    assert result["rows_deleted"] == STEPS * PER_STEP and remaining == 0
    if file_before is not None:  # SQLite: VACUUM gives the pages back
        assert result["file_bytes_after"] < file_before


def test_the_cli_reports_and_reclaims_a_jobs_disk(live_db):
    job_id = seeded("cancelled", finished_days_ago=1)
    runner = CliRunner()
    shown = runner.invoke(cli, ["storage", "show", str(job_id)])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["tables"]["timeline_events"]["rows"] == STEPS * PER_STEP
    kept = runner.invoke(cli, ["storage", "prune"])  # 1 day old: within the default 30 days' retention
    assert kept.exit_code == 0 and json.loads(kept.output)["rows_deleted"] == 0
    dropped = runner.invoke(cli, ["storage", "prune", "--job", str(job_id)])
    assert dropped.exit_code == 0 and json.loads(dropped.output)["rows_deleted"] == STEPS * PER_STEP
    missing = runner.invoke(cli, ["storage", "show", "999999"])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    bad = runner.invoke(cli, ["storage", "prune", "--older-than-days", "-1"])
    assert bad.exit_code == 2 and "--older-than-days" in bad.output


def test_the_storage_route_shows_a_jobs_disk_use(client, session, make_token):
    job = Job(name="s", spec={}, status=JobStatus.SUCCEEDED)
    session.add(job)
    session.commit()
    admin = {"Authorization": f"Bearer {make_token('admin', 'suite-admin')}"}
    answer = client.get(f"/api/v1/jobs/{job.id}/storage", headers=admin)
    assert answer.status_code == 200 and answer.json()["tables"]["timeline_events"] == {"rows": 0, "bytes": 0}
    assert client.get("/api/v1/jobs/999999/storage", headers=admin).status_code == 404


def test_the_workers_retention_thread_prunes_at_its_start_and_stops(live_db, monkeypatch):
    import threading

    from pipeboard.app.core.config import get_settings

    old = seeded("succeeded", finished_days_ago=45)
    monkeypatch.setenv("PIPEBOARD_DETAIL_RETENTION_DAYS", "30")
    get_settings.cache_clear()
    stop = threading.Event()
    thread = threading.Thread(target=storage.prune_periodically, args=(stop,))
    thread.start()
    for _ in range(200):
        if not detail_steps(old):
            break
        threading.Event().wait(0.05)
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive() and detail_steps(old) == set()
