"""The Workers page against `pipeboard up` with one real Celery worker (this host has no GPU, so it
reports none) and a second worker's heartbeat written into the same database with a two-GPU
inventory, as a GPU worker's heartbeat writes it, one GPU held by a queued job's attempt (what
placement records). Screenshot: test-artifacts/workers-page.png."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

pytestmark = pytest.mark.e2e

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85_520_809_984, "capability": "9.0", "cuda": "12.8",
        "driver": "12.8"}


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(workers=1)


def _gpu_worker_holding_a_job(data_dir: Path) -> int:
    from pipeboard.app.core.db import make_engine
    from pipeboard.app.models import Job, JobAttempt, JobStatus, WorkerHeartbeat

    engine = make_engine(f"sqlite:///{data_dir}/pipeboard.sqlite")
    with Session(engine) as s:
        job = Job(name="gpu job", spec={"model": {"name": "mlp-digits"}, "machine": {"device": "cuda"}},
                  status=JobStatus.QUEUED, attempt=1)  # a whole specification: the jobs list reads it
        s.add(job)
        s.flush()
        s.add(JobAttempt(job_id=job.id, attempt=1, trigger="submit", status=JobStatus.QUEUED, nodes=1,
                         gpus={"worker": "pipeboard@gpu-1", "devices": [1]}, prefer_node="pipeboard@gpu-1"))
        s.add(WorkerHeartbeat(hostname="pipeboard@gpu-1", host="gpu-1", pid=1, pool="prefork", concurrency=2,
                              devices=[{"index": i, **H100} for i in range(2)]))
        s.commit()
        job_id = job.id
    engine.dispose()
    return job_id


def test_workers_page_shows_each_worker_its_gpus_and_the_job_holding_one(server, page, shoot) -> None:
    server.sign_in(page)
    page.goto(f"{server.url}/#/workers")
    real = page.locator("section.worker").first
    real.get_by_text("no GPU (CPU jobs only)").wait_for()  # this host's worker, probed: none

    job_id = _gpu_worker_holding_a_job(Path(server.env["PIPEBOARD_DATA_DIR"]))
    gpu = page.locator('section.worker[data-worker="pipeboard@gpu-1"]')
    gpu.get_by_text("2 GPU(s), 1 free").wait_for(timeout=15_000)  # the page refreshes on its own
    rows = gpu.locator("tbody tr")
    assert rows.count() == 2
    assert rows.nth(0).inner_text().split("\t")[:2] == ["cuda:0", H100["name"]]
    assert "free" in rows.nth(0).inner_text()
    assert rows.nth(1).get_by_role("link", name=f"job {job_id}").get_attribute("href") == f"#/jobs/{job_id}"
    assert page.locator('[data-nav="workers"]').get_attribute("aria-current") == "page"
    shoot(page, "workers-page")
    assert page.errors == []


def _cuda_job_placement_could_not_place(data_dir: Path) -> tuple[int, str]:
    """A queued three-GPU job put through placement.dispatch against the same database: no live
    worker has three GPUs free (pipeboard@gpu-1 has two), so it waits with placement's reason."""
    from pipeboard.app.core.db import make_engine
    from pipeboard.app.models import Job, JobAttempt, JobStatus
    from pipeboard.app.services import placement

    engine = make_engine(f"sqlite:///{data_dir}/pipeboard.sqlite")
    with Session(engine) as s:
        spec = {"model": {"name": "mlp-digits"}, "machine": {"device": "cuda"}, "layout": {"workers": 3}}
        job = Job(name="three-gpu job", spec=spec, status=JobStatus.QUEUED, attempt=1)
        s.add(job)
        s.flush()
        s.add(JobAttempt(job_id=job.id, attempt=1, trigger="submit", status=JobStatus.QUEUED, nodes=1))
        s.flush()
        decision = placement.dispatch(s, job.id, 1, placement.GpuRequest(job.id, 3), lambda *a: None)
        s.commit()
        job_id = job.id
    engine.dispose()
    assert isinstance(decision, placement.Waiting)
    return job_id, decision.reason


def test_a_waiting_cuda_jobs_page_says_why_it_waits(server, page, shoot) -> None:
    server.sign_in(page)
    job_id, reason = _cuda_job_placement_could_not_place(Path(server.env["PIPEBOARD_DATA_DIR"]))
    # after the test above: gpu-1's two GPUs (one held while its job is queued); alone: no live worker with a GPU
    assert reason.startswith("waiting: needs 3 GPUs, largest free block ") or reason == (
        "waiting for a worker with a GPU (no live worker reports one)")
    page.goto(f"{server.url}/#/jobs/{job_id}")
    line = page.locator("#job-waiting")
    line.wait_for()
    # the reason as the server places the job again when it is read (gpu-1's heartbeat may have gone stale since)
    assert re.fullmatch(r"Queued, position \d+: waiting(: needs 3 GPUs, largest free block \d"
                        r"| for a worker with a GPU \(no live worker reports one\))\.", line.inner_text())
    shoot(page, "job-waiting")
    assert page.errors == []
