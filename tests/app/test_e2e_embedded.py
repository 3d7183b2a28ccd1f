"""End to end on the embedded deployment (SQLite database and broker): a job over HTTP and the
CLI, its SSE stream to the end, run data; cancel leaves nothing behind; a stopped worker's job
waits for its next attempt and the next worker finishes it. (A SIGKILLed worker: tests/app/test_up.py,
under `pipeboard up`, and tests/app/test_e2e_faults.py, one of two hosts.)

One deployment for the module: the first job measures the model's profile, later ones reuse
it, which keeps the module to a few small runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.app.test_e2e_support import SMALL_JOB, Deployment, embedded_env, group_alive

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("e2e-embedded")
    with Deployment(embedded_env(workdir), workdir).running() as dep:
        yield dep


def wait_until(predicate, timeout: float, what: str, dep: Deployment) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}\n{dep.logs()}")
        time.sleep(0.2)


def test_cli_submit_wait_succeeds_and_run_data_is_there(deployment, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({**SMALL_JOB, "name": "e2e-embedded"}))
    done = subprocess.run(
        [sys.executable, "-c", "from pipeboard.app.cli import main; main()", "submit", str(spec), "--wait", "--url", deployment.url],
        capture_output=True, text=True, timeout=300, env={**os.environ, **deployment.env},
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{deployment.logs()}"
    assert "succeeded" in done.stdout.splitlines()[-1]
    job_id = int(done.stdout.split()[1])

    # The whole log again from the start: lifecycle in order, data batches, one final end.
    messages = list(deployment.events(job_id))
    kinds = [m["event"] for m in messages]
    statuses = [m["data"]["status"] for m in messages if m["event"] == "status"]
    assert kinds[0] == "open" and kinds[-1] == "end" and kinds.count("end") == 1
    assert statuses == ["queued", "running", "succeeded"]
    assert "timeline" in kinds and "metrics" in kinds and "summary" in kinds
    ids = [int(m["id"]) for m in messages if "id" in m and m["event"] != "open"]
    assert ids == list(range(1, len(ids) + 1))

    job = deployment.api("GET", f"/jobs/{job_id}")
    assert job["status"] == "succeeded" and job["plan_id"] and job["profile_id"] and job["summary"]
    measured = deployment.api("GET", f"/jobs/{job_id}/timeline")
    assert measured["total"] > 0 and {e["worker"] for e in measured["events"]} == {0, 1}
    # The job's default weight_grads (batched): input-gradient backwards and one weight pass per step.
    measured_kinds = {e["kind"] for e in measured["events"]}
    assert {"F", "BI", "W"} <= measured_kinds and "B" not in measured_kinds, measured_kinds
    predicted = deployment.api("GET", f"/jobs/{job_id}/timeline", params={"source": "predicted"})
    assert predicted["total"] > 0
    compute = {"F", "B", "BI", "W", "step"}  # the prediction runs the same kinds of action as the run
    assert {e["kind"] for e in predicted["events"]} & compute == measured_kinds & compute
    window = deployment.api("GET", f"/jobs/{job_id}/timeline", params={"step_from": 1, "step_to": 1})
    assert window["events"] and {e["step"] for e in window["events"]} == {1}
    metrics = deployment.api("GET", f"/jobs/{job_id}/metrics")
    assert any("loss" in p["values"] for p in metrics["points"]) and "metric" in metrics["points"][-1]["values"]
    trace = deployment.http.get(f"{deployment.url}/api/v1/jobs/{job_id}/trace")
    assert trace.status_code == 200 and "attachment" in trace.headers["content-disposition"] and trace.json()["traceEvents"]

    # The what-if by model name reuses the profile the job measured (same microbatch size).
    what_if = deployment.api("POST", "/plans", json={"model": "mlp-digits", "batch_size": 16, "microbatches": 2, "levels": [{"workers": 2, "bandwidth": 1e9}], "method": "time"})
    assert what_if["profile_id"] == job["profile_id"] and what_if["predicted"]["timeline"]

    # A profiling task for the same model and size: a job of kind `profile` that reuses it.
    task = deployment.api("POST", "/profiles", json={"model": "mlp-digits", "batch_size": 8})
    assert task["status"] == "queued"
    ends = [m for m in deployment.events(task["id"], timeout=60) if m["event"] == "end"]
    assert ends[0]["data"]["status"] == "succeeded"
    assert deployment.api("GET", f"/jobs/{task['id']}")["summary"] == {"profile_id": job["profile_id"]}, (deployment.api("GET", "/profiles"), deployment.logs())
    rows = deployment.api("GET", f"/profiles/{job['profile_id']}")["layers"]
    assert rows and all(r["forward_ms"] >= 0 for r in rows)

    # Resume mid-stream with Last-Event-ID: exactly the rest, no repeats.
    resumed = [int(m["id"]) for m in deployment.events(job_id, last_id=ids[2]) if m["event"] != "open"]
    assert resumed == ids[3:]


def test_a_train_jobs_summary_carries_its_prediction_fidelity(deployment):
    job = deployment.api("POST", "/jobs", json={**SMALL_JOB, "name": "fidelity", "stop": {"steps": 12}})
    ends = [m for m in deployment.events(job["id"]) if m["event"] == "end"]
    assert ends[0]["data"]["status"] == "succeeded", deployment.logs()
    job = deployment.api("GET", f"/jobs/{job['id']}")
    f = job["summary"]["fidelity"]
    assert job["fidelity"] == f and f["live"] is False
    plan = deployment.api("GET", f"/plans/{job['plan_id']}")
    # the prediction is the plan's; the measurement the run's own step_s (the one definition)
    assert f["basis"] == "steady_step_s" and f["predicted_step_s"] == plan["predicted"]["steady_step_s"]
    assert f["measured_step_s"] == job["summary"]["step_s"] > 0
    assert f["error"] == pytest.approx(f["measured_step_s"] / f["predicted_step_s"] - 1)
    # re-fitted after the first five steps from what they measured: F, BI and the batched W(-1)
    assert f["corrected_after_step"] == 5 and f["corrected_step_s"] > 0
    assert f["corrected_error"] == pytest.approx(f["measured_step_s"] / f["corrected_step_s"] - 1)
    assert {"forward", "backward_input", "weight_batched", "step", "gaps"} <= set(f["terms"])
    assert all(t["measured_s"] > 0 for name, t in f["terms"].items() if name != "gaps")


def test_a_running_job_streams_its_live_and_corrected_fidelity(deployment):
    job = deployment.api("POST", "/jobs", json={**SMALL_JOB, "name": "live fidelity", "stop": {"steps": 400}})
    messages = list(deployment.events(job["id"]))
    assert messages[-1]["data"]["status"] == "succeeded", deployment.logs()
    live = [m["data"] for m in messages if m["event"] == "fidelity"]
    assert live and all(f["live"] for f in live)
    corrected = [f for f in live if f["corrected_step_s"] is not None]
    assert corrected and corrected[0]["corrected_after_step"] == 5 and corrected[0]["measured_steps"] >= 5
    final = deployment.api("GET", f"/jobs/{job['id']}")["fidelity"]
    # the final figures re-fit the same first steps: the same correction as the one streamed
    assert not final["live"] and final["corrected_step_s"] == corrected[0]["corrected_step_s"]
    assert final["measured_steps"] == 400


def test_failing_job_exits_nonzero_with_its_error(deployment, tmp_path):
    spec = tmp_path / "bad.yaml"  # data parallel replicas cannot run an interleaved schedule
    spec.write_text(yaml.safe_dump({**SMALL_JOB, "method": "dp", "schedule": "interleaved-1f1b"}))
    done = subprocess.run(
        [sys.executable, "-c", "from pipeboard.app.cli import main; main()", "submit", str(spec), "--wait", "--url", deployment.url],
        capture_output=True, text=True, timeout=120, env={**os.environ, **deployment.env},
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: job ") and "failed: schedule:" in last and "interleaved-1f1b" in last


def test_cancel_while_running_leaves_no_process(deployment, tmp_path):
    spec = tmp_path / "long.yaml"
    spec.write_text(yaml.safe_dump({**SMALL_JOB, "stop": {"time_s": 300}}))
    waiter = subprocess.Popen(
        [sys.executable, "-c", "from pipeboard.app.cli import main; main()", "submit", str(spec), "--wait", "--url", deployment.url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **deployment.env},
    )
    try:
        wait_until(lambda: deployment.api("GET", "/jobs", params={"status": "running"})["count"] == 1, 60, "a running job", deployment)
        job_id = deployment.api("GET", "/jobs", params={"status": "running"})["data"][0]["id"]
        row = deployment.wait_for_training(job_id)
        assert group_alive(row.pgid)
        cancelled = deployment.api("POST", f"/jobs/{job_id}/cancel")
        assert cancelled["status"] == "cancelled"
        wait_until(lambda: not group_alive(row.pgid), 15, f"process group {row.pgid} to end", deployment)
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 1 and "cancelled" in err, (out, err)
    finally:
        if waiter.poll() is None:
            waiter.kill()


def test_stopping_a_worker_requeues_its_job_and_ends_the_run(deployment):
    """Ctrl-C on `pipeboard up` (SIGTERM to the worker): no waiting on the run, no orphan; the job
    waits in the queue for its next attempt (the next `pipeboard up` resumes it)."""
    job = deployment.api("POST", "/jobs", json={**SMALL_JOB, "stop": {"steps": 400}})  # the profile measured above
    row = deployment.wait_for_training(job["id"], after=job["last_event_seq"])
    os.killpg(deployment.worker.pid, signal.SIGTERM)
    assert deployment.worker.wait(timeout=30) is not None
    job = deployment.api("GET", f"/jobs/{job['id']}")
    assert job["status"] == "queued" and job["attempt"] == 2, job
    assert "worker was stopped" in job["attempts"][0]["error"] and job["attempts"][1]["trigger"] == "auto"
    wait_until(lambda: not group_alive(row.pgid), 15, "the run to end", deployment)
    deployment.worker = deployment.start_worker()  # the retry's task is waiting in the broker for it
    end = [m for m in deployment.events(job["id"], last_id=job["last_event_seq"]) if m["event"] == "end"]
    assert end[0]["data"]["status"] == "succeeded", deployment.logs()


def test_a_job_trains_with_a_schedule_file_torch_wrote(deployment, tmp_path):
    """torch's own ZBV (its _dump_csv of ScheduleZBVZeroBubble: two chunks per worker, placed in a
    V) attached from the job YAML by `pipeboard submit`, checked at the door and run as written."""
    from pipeboard.trainer.schedule.torchcsv import dumps
    from pipeboard.trainer.schedule.torch_reference import torch_rows

    (tmp_path / "zbv.csv").write_text(dumps(torch_rows("zbv", 2, 4)))
    # depth 3: four layers with parameters, a stage for each of the 2 workers x 2 chunks
    job_yaml = {"version": 2, "name": "torch zbv", "model": {"name": "mlp-digits", "args": {"depth": 3}, "batch_size": 16},
                "layout": {"workers": 2, "method": "time", "schedule": "custom", "schedule_file": "zbv.csv",
                           "chunks": 2, "microbatches": 4},
                "length": {"steps": 3}}
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job_yaml))
    done = subprocess.run(
        [sys.executable, "-c", "from pipeboard.app.cli import main; main()", "submit", str(spec), "--url", deployment.url],
        capture_output=True, text=True, timeout=300, env={**os.environ, **deployment.env},
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{deployment.logs()}"
    job_id = int(done.stdout.split()[1])
    ends = [m for m in deployment.events(job_id) if m["event"] == "end"]
    assert ends[0]["data"]["status"] == "succeeded", (deployment.api("GET", f"/jobs/{job_id}"), deployment.logs())
    job = deployment.api("GET", f"/jobs/{job_id}")
    assert job["status"] == "succeeded" and job["spec"]["layout"]["schedule_file"] == (tmp_path / "zbv.csv").read_text()
    events = deployment.api("GET", f"/jobs/{job_id}/timeline", params={"step_from": 1, "step_to": 1})["events"]
    # the V: worker 0 runs virtual stages 0 and 3, worker 1 stages 1 and 2; split backwards as torch wrote them
    assert {(e["worker"], e["stage"]) for e in events} == {(0, 0), (0, 3), (1, 1), (1, 2)}
    assert {"F", "BI", "W"} <= {e["kind"] for e in events}

    # a broken file is refused at submit, by the server too: one line naming the field, the rank and the action
    broken = dict(job_yaml, layout={**job_yaml["layout"], "schedule_file": "0F0,0B0,0F1,0B1\n1B0,1F0,1F1,1B1\n"})
    answer = deployment.http.post(f"{deployment.url}/api/v1/jobs", json=broken)
    assert answer.status_code == 422 and answer.json()["detail"].startswith(
        "layout.schedule_file: deadlock: rank 1 waits at 1B0 for 1F0"), answer.text
