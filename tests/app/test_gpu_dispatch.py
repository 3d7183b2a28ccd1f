"""cuda jobs through the job path (jobs.submit -> placement.dispatch -> a worker's direct queue):
accepted when a live worker reports enough GPUs, refused when none could ever serve, waiting with
its reason when the GPUs are held, and dispatched again when the holder ends. Workers are
heartbeat rows with a stand-in GPU inventory (no GPU here); the broker is recorded, not run."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from pipeboard.app.models import JobAttempt, JobStatus, WorkerHeartbeat, utcnow
from pipeboard.app.schemas import JobSpec
from pipeboard.app.services import jobs, placement
from pipeboard.app.services.errors import ServiceError


def _gpu_worker(session: Session, name: str, n: int) -> None:
    session.add(WorkerHeartbeat(hostname=name, host=name.split("@")[-1], pid=1, pool="prefork", concurrency=2,
                                devices=[{"index": i, "name": "stand-in GPU"} for i in range(n)], seen_at=utcnow()))
    session.commit()


def _spec(**layout) -> JobSpec:
    return JobSpec.model_validate({"model": "mlp-digits", "machine": {"device": "cuda"},
                                   "layout": {"workers": 1, **layout}, "length": {"steps": 2}})


@pytest.fixture
def sent(monkeypatch) -> list[tuple]:
    out: list[tuple] = []
    monkeypatch.setattr(jobs, "send_task", lambda name, *args, queue=None: out.append((name, args, queue)))
    return out


def test_cuda_refused_without_a_gpu_worker_naming_the_field(session: Session, sent):
    with pytest.raises(ServiceError) as err:
        jobs.submit(session, _spec())
    assert err.value.status == 422 and str(err.value).startswith("machine.device: device cuda")


def test_cuda_job_needing_more_gpus_than_any_worker_is_refused_naming_layout_workers(session: Session, sent):
    _gpu_worker(session, "pipeboard@gpu1", 1)
    with pytest.raises(ServiceError) as err:
        jobs.submit(session, JobSpec.model_validate({"model": "mlp-digits", "machine": {"device": "cuda"},
                                                     "layout": {"workers": 2}, "length": {"steps": 2}}))
    assert err.value.status == 422 and str(err.value).startswith("layout.workers:")


def test_placed_then_waits_then_dispatched_when_the_first_ends(session: Session, sent):
    _gpu_worker(session, "pipeboard@gpu1", 1)
    first = jobs.submit(session, _spec())
    assert placement.held_devices(session, first.id, 1) == "0"
    assert sent[0][0] == "pipeboard.resume_job" and sent[0][1] == (first.id, 1)
    assert session.get(JobAttempt, (first.id, 1)).prefer_node == "pipeboard@gpu1"

    second = jobs.submit(session, _spec())
    row = session.get(JobAttempt, (second.id, 1))
    assert row.waiting == "waiting: all 1 GPU busy (needs 1)" and len(sent) == 1
    shown = jobs.to_public(session, jobs.get(session, second.id))  # what GET /jobs/{id} and the job page show
    assert shown.waiting == row.waiting and shown.attempts[-1].waiting == row.waiting
    assert jobs.to_public(session, jobs.get(session, first.id)).waiting is None
    assert jobs.dispatch_waiting(session) == 0  # still held

    jobs.finish(session, first.id, JobStatus.SUCCEEDED, expected=(JobStatus.QUEUED,))  # ends its attempt too
    session.refresh(row)
    assert row.waiting is None and placement.held_devices(session, second.id, 1) == "0"
    assert sent[-1][1] == (second.id, 1)


def test_reading_a_waiting_job_never_releases_it_to_any_worker(session: Session, sent):
    """GET /jobs/{id} reaps stale work first: a job waiting for GPUs (meant for no worker yet) is not
    'waiting for a worker that is gone', and stays waiting, never queued for any worker to claim."""
    _gpu_worker(session, "pipeboard@gpu1", 1)
    jobs.submit(session, _spec())
    second = jobs.submit(session, _spec())
    for _ in range(2):
        jobs.get(session, second.id)
    row = session.get(JobAttempt, (second.id, 1))
    session.refresh(row)
    assert row.prefer_node == placement.WAITING_FOR_GPUS and row.gpus is None and len(sent) == 1


def test_a_placed_attempt_whose_gpu_worker_is_gone_is_placed_again_not_released(session: Session, sent):
    from datetime import timedelta

    from pipeboard.app.core.config import get_settings

    _gpu_worker(session, "pipeboard@gpu1", 1)
    job = jobs.submit(session, _spec())
    beat = session.get(WorkerHeartbeat, "pipeboard@gpu1")
    beat.seen_at = utcnow() - timedelta(seconds=get_settings().stale_after_seconds + 30)
    session.commit()
    jobs.get(session, job.id)  # reaps: its worker is gone, no other has a GPU
    row = session.get(JobAttempt, (job.id, 1))
    session.refresh(row)
    assert row.prefer_node == placement.WAITING_FOR_GPUS and row.gpus is None
    assert row.waiting == "waiting for a worker with a GPU (no live worker reports one)"  # placed again at once
    assert len(sent) == 1  # only the first placement's task went: nothing queued for just any worker
    _gpu_worker(session, "pipeboard@gpu2", 1)  # a GPU worker comes: the next reap places it there
    jobs.get(session, job.id)
    session.refresh(row)
    assert row.gpus == {"worker": "pipeboard@gpu2", "devices": [0]} and sent[-1][2] is not None


def test_a_job_whose_stages_share_one_gpu_is_placed_on_a_one_gpu_worker(session: Session, sent):
    _gpu_worker(session, "pipeboard@gpu1", 1)
    shared = jobs.submit(session, JobSpec.model_validate({"model": "mlp-digits", "machine": {"device": "cuda", "gpus_per_host": 1},
                                                          "layout": {"workers": 2}, "length": {"steps": 2}}))
    assert placement.held_devices(session, shared.id, 1) == "0"  # both stage processes on the one GPU
    assert sent[0][1] == (shared.id, 1)
    with pytest.raises(ServiceError) as err:  # more shared GPUs than the job has processes
        jobs.submit(session, JobSpec.model_validate({"model": "mlp-digits", "machine": {"device": "cuda", "gpus_per_host": 3},
                                                     "layout": {"workers": 2}, "length": {"steps": 2}}))
    assert err.value.status == 422 and str(err.value).startswith("machine.gpus_per_host:")


def test_gpus_per_host_is_refused_for_a_cpu_job_naming_the_field(session: Session, sent):
    with pytest.raises(ServiceError) as err:
        jobs.submit(session, JobSpec.model_validate({"model": "mlp-digits", "machine": {"gpus_per_host": 1},
                                                     "layout": {"workers": 2}, "length": {"steps": 2}}))
    assert err.value.status == 422 and str(err.value).startswith("machine.gpus_per_host:")
