"""Placement of cuda jobs over the GPU inventories workers report (app/services/placement.py):
the pure decision over inventories, then the same through the database (heartbeats with
devices, attempts that hold GPUs) and dispatch to a worker's own queue."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.orm import Session

from pipeboard.app.core.config import get_settings
from pipeboard.app.models import Job, JobAttempt, JobStatus, WorkerHeartbeat, utcnow
from pipeboard.app.services import placement
from pipeboard.app.services.placement import GpuPlacement, GpuRequest, Waiting, WorkerInventory, place, place_in_order, refusal


def gpus(n: int) -> tuple[int, ...]:
    return tuple(range(n))


def test_two_one_gpu_jobs_on_a_two_gpu_worker_each_get_their_own_and_a_four_gpu_job_waits():
    workers = [WorkerInventory("pipeboard@a", "a", gpus(2))]
    decisions = place_in_order([GpuRequest(1, 1), GpuRequest(2, 1), GpuRequest(3, 4)], workers)
    assert decisions[1] == GpuPlacement("pipeboard@a", (0,))
    assert decisions[2] == GpuPlacement("pipeboard@a", (1,))
    assert decisions[3] == Waiting("waiting: all 2 GPUs busy (needs 4)")
    assert decisions[1].visible == "0" and decisions[2].visible == "1"


def test_a_third_one_gpu_job_waits_behind_two_on_a_two_gpu_worker():
    workers = [WorkerInventory("pipeboard@a", "a", gpus(2), {0: 1, 1: 2})]
    assert place(GpuRequest(3, 1), workers) == Waiting("waiting: all 2 GPUs busy (needs 1)")


def test_a_four_gpu_job_waits_naming_the_largest_free_block():
    workers = [WorkerInventory("pipeboard@a", "a", gpus(4), {0: 1, 1: 2}), WorkerInventory("pipeboard@b", "b", gpus(1))]
    assert place(GpuRequest(3, 4), workers) == Waiting("waiting: needs 4 GPUs, largest free block 2")


def test_an_eight_gpu_worker_runs_two_four_gpu_jobs_at_once():
    workers = [WorkerInventory("pipeboard@big", "big", gpus(8))]
    decisions = place_in_order([GpuRequest(1, 4), GpuRequest(2, 4), GpuRequest(3, 1)], workers)
    assert decisions[1] == GpuPlacement("pipeboard@big", (0, 1, 2, 3))
    assert decisions[2] == GpuPlacement("pipeboard@big", (4, 5, 6, 7))
    assert decisions[1].visible == "0,1,2,3" and decisions[2].visible == "4,5,6,7"
    assert isinstance(decisions[3], Waiting)


def test_two_jobs_never_share_a_gpu_over_any_order_of_requests():
    workers = [WorkerInventory("w@a", "a", gpus(8)), WorkerInventory("w@b", "b", gpus(3))]
    sizes = [3, 1, 4, 2, 2, 1, 3, 1]
    decisions = place_in_order([GpuRequest(i + 1, n) for i, n in enumerate(sizes)], workers)
    taken = [(d.worker, g) for d in decisions.values() if isinstance(d, GpuPlacement) for g in d.devices]
    assert len(taken) == len(set(taken))
    for i, n in enumerate(sizes):
        d = decisions[i + 1]
        assert isinstance(d, Waiting) or len(d.devices) == n
    assert len(taken) == 11  # every GPU of both workers in use: best fit wastes none here


def test_best_fit_keeps_a_large_block_whole_for_a_large_job():
    workers = [WorkerInventory("w@big", "big", gpus(4)), WorkerInventory("w@small", "small", gpus(1))]
    decisions = place_in_order([GpuRequest(1, 1), GpuRequest(2, 4)], workers)
    assert decisions[1] == GpuPlacement("w@small", (0,))
    assert decisions[2] == GpuPlacement("w@big", (0, 1, 2, 3))


def test_processes_share_gpus_when_the_job_asks():
    workers = [WorkerInventory("w@a", "a", gpus(1))]
    assert place(GpuRequest(1, 4, gpus_per_host=1), workers) == GpuPlacement("w@a", (0,))
    assert place(GpuRequest(1, 4), workers) == Waiting("waiting: needs 4 GPUs, largest free block 1")


def test_a_job_no_live_worker_could_ever_serve_is_refused_naming_the_field():
    cpu_only = [WorkerInventory("w@a", "a", ())]
    assert refusal(GpuRequest(1, 1), cpu_only).startswith("machine.device: device cuda: no live worker reports a GPU")
    assert refusal(GpuRequest(1, 1), []).startswith("machine.device:")
    two = [WorkerInventory("w@a", "a", gpus(2), {0: 9, 1: 9})]
    assert refusal(GpuRequest(1, 2), two) is None  # busy now, servable later: it waits instead
    assert refusal(GpuRequest(1, 4), two).startswith("layout.workers: the job needs 4 GPUs on one worker")
    assert refusal(GpuRequest(1, 2, gpus_per_host=3), two).startswith("machine.gpus_per_host: must be 1 to 2")


GIB = 2**30


def test_a_shared_job_packs_its_stages_onto_one_gpu_by_memory_and_waits_or_is_refused_when_they_do_not_fit():
    one = [WorkerInventory("w@a", "a", gpus(1), memory={0: 80 * GIB})]
    four_small = (2 * GIB, 3 * GIB, 2 * GIB, 1 * GIB)
    assert place(GpuRequest(1, 4, gpus_per_host=1, process_bytes=four_small), one) == GpuPlacement("w@a", (0,), (0, 0, 0, 0))
    assert GpuPlacement("w@a", (0,), (0, 0, 0, 0)).as_row() == {"worker": "w@a", "devices": [0], "ranks": [0, 0, 0, 0]}
    too_big = (30 * GIB, 30 * GIB, 30 * GIB)  # each fits alone, not three on one 80 GiB GPU
    waiting = place(GpuRequest(1, 3, gpus_per_host=1, process_bytes=too_big), one)
    assert isinstance(waiting, Waiting) and waiting.reason.startswith("waiting: no free 1 GPU with the memory its stages need")
    assert refusal(GpuRequest(1, 3, gpus_per_host=1, process_bytes=too_big), one).startswith(
        "machine.gpus_per_host: 1 shared GPUs cannot hold the job's stages: stage process 2 needs 30.50 GiB")
    # two GPUs: the three 30 GiB processes spread two and one, the larger pair never on one GPU beyond its room
    two = [WorkerInventory("w@b", "b", gpus(2), memory={0: 80 * GIB, 1: 80 * GIB})]
    placed = place(GpuRequest(1, 3, gpus_per_host=2, process_bytes=too_big), two)
    assert placed.devices == (0, 1) and sorted(placed.ranks) == [0, 0, 1]
    assert refusal(GpuRequest(1, 3, gpus_per_host=2, process_bytes=too_big), two) is None


def test_a_shared_job_takes_the_free_gpus_with_the_most_memory():
    mixed = [WorkerInventory("w@m", "m", gpus(3), {0: 7}, memory={0: 80 * GIB, 1: 24 * GIB, 2: 48 * GIB})]
    placed = place(GpuRequest(1, 2, gpus_per_host=1, process_bytes=(20 * GIB, 20 * GIB)), mixed)
    assert placed == GpuPlacement("w@m", (2,), (2, 2))  # GPU 0 is held; 48 GiB holds both, 24 GiB would not


def test_why_a_job_waits_in_the_words_the_job_page_shows():
    assert place(GpuRequest(1, 1), [WorkerInventory("w@cpu", "c", ())]) == Waiting(
        "waiting for a worker with a GPU (no live worker reports one)")
    assert place(GpuRequest(1, 1), []).reason.startswith("waiting for a worker with a GPU")
    busy = [WorkerInventory("w@a", "a", gpus(2), {0: 1, 1: 2})]
    assert place(GpuRequest(3, 2), busy) == Waiting("waiting: all 2 GPUs busy (needs 2)")
    half = [WorkerInventory("w@a", "a", gpus(4), {0: 1, 1: 2})]
    assert place(GpuRequest(3, 3), half) == Waiting("waiting: needs 3 GPUs, largest free block 2")


# ---- through the database --------------------------------------------------------------------

def _worker(session: Session, name: str, n: int | None, ago_s: float = 0) -> None:
    devices = None if n is None else [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85_520_809_984,
                                       "capability": "9.0", "cuda": "12.8", "driver": "12.8"} for i in range(n)]
    session.add(WorkerHeartbeat(hostname=name, host=name.split("@")[-1], pid=1, pool="prefork", concurrency=2,
                                devices=devices, seen_at=utcnow() - timedelta(seconds=ago_s)))
    session.flush()


def _queued_job(session: Session) -> int:
    job = Job(name="gpu job", spec={"machine": {"device": "cuda"}}, status=JobStatus.QUEUED, attempt=1)
    session.add(job)
    session.flush()
    session.add(JobAttempt(job_id=job.id, attempt=1, trigger="submit", status=JobStatus.QUEUED, nodes=1))
    session.flush()
    return job.id


def test_dispatch_holds_gpus_sends_to_the_worker_and_a_later_job_waits_with_its_reason(session: Session):
    _worker(session, "pipeboard@gpu2", 2)
    _worker(session, "pipeboard@cpu", 0)
    _worker(session, "pipeboard@gone", 8, ago_s=get_settings().stale_after_seconds + 30)  # heartbeats stopped
    sent = []
    first, second, third = (_queued_job(session) for _ in range(3))
    for job_id in (first, second):
        decision = placement.dispatch(session, job_id, 1, GpuRequest(job_id, 1), lambda *a: sent.append(a))
        assert isinstance(decision, GpuPlacement)
    assert sent == [(first, "pipeboard@gpu2", 1), (second, "pipeboard@gpu2", 1)]
    rows = {j: session.get(JobAttempt, (j, 1)) for j in (first, second)}
    assert rows[first].gpus == {"worker": "pipeboard@gpu2", "devices": [0]} and rows[first].prefer_node == "pipeboard@gpu2"
    assert rows[second].gpus == {"worker": "pipeboard@gpu2", "devices": [1]}
    assert placement.held_devices(session, second, 1) == "1"

    waiting = placement.dispatch(session, third, 1, GpuRequest(third, 4), lambda *a: sent.append(a))
    assert waiting == Waiting("waiting: all 2 GPUs busy (needs 4)")
    row = session.get(JobAttempt, (third, 1))
    assert row.waiting == waiting.reason and row.gpus is None
    assert row.prefer_node == placement.WAITING_FOR_GPUS  # no worker's claim takes it (runner.claim_next)
    assert len(sent) == 2

    # the first job ends: its GPU is free again, and the view says which job holds the other
    session.get(JobAttempt, (first, 1)).status = JobStatus.SUCCEEDED
    session.flush()
    view = {w["worker"]: w for w in placement.workers_view(session)}
    assert set(view) == {"pipeboard@gpu2", "pipeboard@cpu"}
    assert [d["job_id"] for d in view["pipeboard@gpu2"]["devices"]] == [None, second]
    assert view["pipeboard@cpu"]["devices"] == []
    assert placement.gpu_workers(session) == 1


def test_a_worker_that_has_not_reported_yet_offers_no_gpu(session: Session):
    _worker(session, "pipeboard@new", None)
    (inventory,) = placement.live_inventories(session)
    assert inventory.gpus == ()
    assert placement.workers_view(session)[0]["devices_reported"] is False
    assert placement.gpu_workers(session) == 0


def test_a_send_that_fails_leaves_the_caller_to_roll_back(session: Session):
    _worker(session, "pipeboard@gpu1", 1)
    job_id = _queued_job(session)
    session.commit()

    def broker_down(*_):
        raise ConnectionError("broker unreachable")

    with pytest.raises(ConnectionError):
        placement.dispatch(session, job_id, 1, GpuRequest(job_id, 1), broker_down)
    session.rollback()
    assert placement.live_inventories(session)[0].held == {}
    assert session.get(JobAttempt, (job_id, 1)).prefer_node is None


def test_get_workers_lists_each_worker_its_gpus_and_the_job_holding_each(client, session: Session):
    _worker(session, "pipeboard@gpu2", 2)
    _worker(session, "pipeboard@cpu", 0)
    job_id = _queued_job(session)
    placement.dispatch(session, job_id, 1, GpuRequest(job_id, 1), lambda *a: None)
    session.flush()
    body = client.get("/api/v1/workers").json()
    assert body["count"] == 2
    listed = {w["worker"]: w for w in body["data"]}
    gpu = listed["pipeboard@gpu2"]
    assert gpu["host"] == "gpu2" and gpu["devices_reported"] is True
    assert [(d["index"], d["name"], d["job_id"]) for d in gpu["devices"]] == [
        (0, "NVIDIA H100 80GB HBM3", job_id), (1, "NVIDIA H100 80GB HBM3", None)]
    assert listed["pipeboard@cpu"]["devices"] == []


def test_get_workers_needs_a_token(anonymous):
    assert anonymous.get("/api/v1/workers").status_code == 401
