"""The runner's mechanics without torch: claiming in priority order, one winner per job,
process groups ended on cancel, and a run's sink ending its own group when its job is over."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import select, update

from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import Job, JobEvent, JobStatus
from pipeboard.app.services import jobs, runner
from tests.app.test_e2e_support import group_alive
from tests.app.test_services_support import live_db, new_job  # noqa: F401  (fixture)
from tests.conftest import ROOT


def status_of(job_id: int) -> JobStatus:
    with get_sessionmaker()() as s:
        return s.get(Job, job_id).status


def test_claims_follow_priority_and_each_job_is_claimed_once(live_db):
    low = new_job(priority=0)
    high = new_job(priority=9)
    mid = new_job(priority=5)
    claimed: list[int] = []
    threads = [threading.Thread(target=lambda: claimed.append(runner.claim_next("t"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(c for c in claimed if c) == sorted([low, high, mid]) and claimed.count(None) == 1
    assert {status_of(j) for j in (low, high, mid)} == {JobStatus.RUNNING}
    first = new_job(priority=1)
    second = new_job(priority=2)
    assert runner.claim_next("t") == second and runner.claim_next("t") == first


def test_cancel_ends_the_whole_process_group(live_db, tmp_path):
    job_id = new_job()
    assert runner.claim_next("t") == job_id
    run = runner.JobRun(job_id)
    monitor = threading.Thread(target=run._monitor, daemon=True)
    monitor.start()
    # A leader with two children that ignore nothing: all three share the new group.
    script = "import subprocess, sys, time; [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']) for _ in range(2)]; time.sleep(600)"
    result: dict = {}

    def child() -> None:
        try:
            run.run_child([sys.executable, "-c", script], tmp_path / "child.log", phase="train")
        except runner.Stopped:
            result["stopped"] = True

    worker = threading.Thread(target=child)
    worker.start()
    deadline = time.monotonic() + 20
    while True:
        with get_sessionmaker()() as s:
            pgid = s.get(Job, job_id).pgid
        if pgid:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(0.5)
    with get_sessionmaker()() as s:
        jobs.finish(s, job_id, JobStatus.CANCELLED, expected=(JobStatus.RUNNING,))
    worker.join(timeout=15)
    run.stop.set()
    assert result.get("stopped")
    deadline = time.monotonic() + 5  # SIGKILLed: its processes are gone within moments, not at once
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group_alive(pgid)


def test_sink_ends_its_group_when_the_job_is_over(live_db):
    job_id = new_job("running")
    code = (
        "import time\n"
        "from pipeboard.app.services.run_sink import DbSink\n"
        f"sink = DbSink({job_id}, own_group=True)\n"
        "for i in range(600):\n"
        "    sink.on_status('running', str(i))\n"
        "    time.sleep(0.1)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ), start_new_session=True)
    try:
        time.sleep(3)
        assert proc.poll() is None
        with get_sessionmaker()() as s:
            jobs.finish(s, job_id, JobStatus.FAILED, expected=(JobStatus.RUNNING,), error="worker lost")
        assert proc.wait(timeout=15) == -15  # SIGTERM from its own sink
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_train_jobs_profile_phase_stores_the_calibration(live_db, tmp_path):
    """The real profiling child: the profile at the microbatch size carries the link, the
    runtime's per-action overhead and the layers' weight gradients timed at the whole batch."""
    from pipeboard.app.models import Profile as ProfileRow
    from pipeboard.trainer.profile.schema import Profile

    from pipeboard.app.schemas import JobSpec

    spec = JobSpec.model_validate({"model": {"name": "mlp-digits", "args": {"hidden": 16}, "batch_size": 16},
                                   "layout": {"workers": 2, "schedule": "1f1b", "microbatches": 4,
                                              "weight_grads": "batched"}}).model_dump(mode="json")
    job_id = new_job("running", kind="train")
    with get_sessionmaker()() as s:
        s.execute(update(Job).where(Job.id == job_id).values(spec=spec))
        s.commit()
    run = runner.JobRun(job_id)
    try:
        profile_id = run.profile_phase(run.session.get(Job, job_id), tmp_path)
        with get_sessionmaker()() as s:
            prof = Profile.from_dict(s.get(ProfileRow, profile_id).data)
            assert s.get(Job, job_id).profile_id == profile_id
            messages = [e.payload.get("message", "") for e in s.scalars(select(JobEvent).where(JobEvent.job_id == job_id))]
        assert prof.batch_size == 4 and prof.weight_batch_size == 16
        # measured under the allocator settings `pipeboard train` runs with (an explicit 0 stays)
        assert prof.meta["allocator"] == {"huge_pages": os.environ.get("THP_MEM_ALLOC_ENABLE", "1") == "1",
                                          "keep_freed_memory": True}
        assert prof.link is not None and prof.link.bytes_per_ms > 0
        assert prof.overhead is not None and {s["last"] for s in prof.overhead.samples} == {False, True}
        weighted = [layer for layer in prof.layers if layer.parameter_bytes > 0]
        assert weighted and all(layer.weight_batched_ms is not None for layer in weighted)
        assert any("link" in m and "overhead" in m for m in messages), messages
        # the next job of the same shape reuses it; immediate weight gradients need another
        assert run.profile_phase(run.session.get(Job, job_id), tmp_path) == profile_id
    finally:
        run.session.close()
    assert "--weight-batch-size" not in runner.profiles.calibration_args(2, 16, "immediate")


def test_weight_gradients_at_the_batch_follow_what_the_runtimes_w_batches():
    """Plain Linear layers: timed again at the whole batch (one matmul in W(-1)); other layers:
    the runtime computes them one microbatch at a time, so M times their part at the microbatch."""
    from pipeboard.app.services.profile_run import profile
    from pipeboard.trainer.profile.schema import Profile

    prof = Profile.from_dict(profile("cnn-digits", {"channels": 4}, 2, repeats=1, weight_batch_size=6))
    assert prof.weight_batch_size == 6 and prof.link is None and prof.overhead is None
    convs = [layer for layer in prof.layers if layer.desc.startswith("Conv2d")]
    assert convs and all(layer.weight_batched_ms == pytest.approx(3 * layer.backward_weight_ms) for layer in convs)
    linears = [layer for layer in prof.layers if layer.desc.startswith("Linear(")]
    assert linears and all(layer.weight_batched_ms is not None for layer in linears)


def test_profiles_measured_with_other_matmul_kernels_are_not_reused(monkeypatch):
    """A profile timed with oneDNN's kernels (about twice as fast) must not feed runs on the
    default ones, nor the other way round: the cache key names the kernels."""
    from pipeboard.app.services.profiles import cache_key
    from pipeboard.trainer import cpu_matmul

    monkeypatch.delenv(cpu_matmul.ENV, raising=False)
    plain = cache_key("mlp", {"depth": 2}, 16, "cpu", ["--threads", "1"])
    monkeypatch.setenv(cpu_matmul.ENV, "default")
    assert cache_key("mlp", {"depth": 2}, 16, "cpu", ["--threads", "1"]) == plain
    monkeypatch.setenv(cpu_matmul.ENV, "onednn")
    fast = cache_key("mlp", {"depth": 2}, 16, "cpu", ["--threads", "1"])
    assert fast != plain and "matmul=onednn" in fast
    # a profiling task (no calibration) reuses a job's calibrated profile: its key starts the job's
    assert fast.startswith(cache_key("mlp", {"depth": 2}, 16, "cpu") + " ")
    assert "matmul" not in cache_key("mlp", {"depth": 2}, 16, "cuda")


def test_a_what_ifs_profiling_job_runs_on_the_worker_and_then_the_what_if_plans(live_db):
    """POST /plans's path without a cached profile: the profiling job (run here as a worker runs
    it, profiling in its own child process), then the same request plans from what it stored."""
    from pipeboard.app.models import Plan as PlanRow
    from pipeboard.app.schemas import PlanCreate
    from pipeboard.app.services import plans

    body = PlanCreate(model="mlp-digits", model_args={"hidden": 12}, batch_size=16, microbatches=2,
                      levels=[{"workers": 2, "bandwidth": 1e9}], method="time")
    with get_sessionmaker()() as s:
        job = plans.create(s, body)
        assert isinstance(job, Job) and job.kind == "profile"
        job_id = job.id
    assert runner.run_next(job_id=job_id, attempt=1) == job_id  # as the worker's task does
    with get_sessionmaker()() as s:
        done = s.get(Job, job_id)
        assert done.status == JobStatus.SUCCEEDED, done.error
        made = plans.create(s, body)
        assert isinstance(made, PlanRow) and made.profile_id == done.summary["profile_id"]
        assert made.predicted["cost_model"] == "profile"  # the calibrated profile: the run's cost model

