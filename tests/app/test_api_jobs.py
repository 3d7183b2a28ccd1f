"""Jobs over HTTP without a worker: submit, queue order, list/filter, cancel, retry, reaper, errors."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from pipeboard.app.models import Job, JobEvent, JobStatus
from pipeboard.app.services import jobs

JOB = {"model": "mlp-digits", "workers": 2, "schedule": "1f1b", "microbatches": 2, "batch_size": 16, "stop": {"steps": 3}}


def submit(client, **overrides):
    response = client.post("/api/v1/jobs", json={**JOB, **overrides})
    assert response.status_code == 201, response.text
    return response.json()


def test_submit_then_get(client):
    job = submit(client, name="first")
    assert job["status"] == "queued" and job["queue_position"] == 1 and job["name"] == "first"
    # the flat version-1 body, stored as version 2
    assert job["spec"]["version"] == 2 and job["spec"]["model"]["name"] == "mlp-digits"
    assert job["spec"]["length"] == {"epochs": None, "steps": 3, "target": None, "time_s": None, "eval_every": None}
    got = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert got["id"] == job["id"] and got["last_event_seq"] == 1


def test_queue_position_follows_priority(client):
    low = submit(client, priority=0)
    high = submit(client, priority=5)
    later_low = submit(client, priority=0)
    pos = {j["id"]: j["queue_position"] for j in client.get("/api/v1/jobs").json()["data"]}
    assert pos[high["id"]] == 1 and pos[low["id"]] == 2 and pos[later_low["id"]] == 3


def test_list_paging_and_status_filter(client):
    ids = [submit(client)["id"] for _ in range(3)]
    client.post(f"/api/v1/jobs/{ids[0]}/cancel")
    page = client.get("/api/v1/jobs", params={"limit": 2, "offset": 0}).json()
    assert page["count"] == 3 and [j["id"] for j in page["data"]] == ids[:0:-1]
    cancelled = client.get("/api/v1/jobs", params={"status": "cancelled"}).json()
    assert cancelled["count"] == 1 and cancelled["data"][0]["id"] == ids[0]
    assert client.get("/api/v1/jobs", params={"status": "bogus"}).status_code == 422


def test_cancel_queued_then_retry(client, session):
    job = submit(client)
    cancelled = client.post(f"/api/v1/jobs/{job['id']}/cancel").json()
    assert cancelled["status"] == "cancelled" and cancelled["queue_position"] is None
    kinds = session.scalars(select(JobEvent.kind).where(JobEvent.job_id == job["id"]).order_by(JobEvent.seq)).all()
    assert kinds == ["status", "status", "end"]
    again = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 409 and "already cancelled" in again.json()["detail"]
    retried = client.post(f"/api/v1/jobs/{job['id']}/retry").json()
    assert retried["status"] == "queued" and retried["attempt"] == 2
    assert [(a["attempt"], a["trigger"], a["status"]) for a in retried["attempts"]] == [(1, "submit", "cancelled"),
                                                                                        (2, "manual", "queued")]
    assert client.post(f"/api/v1/jobs/{job['id']}/retry").status_code == 409


def test_errors_name_the_field(client):
    unknown = client.post("/api/v1/jobs", json={**JOB, "model": "no-such-model"})
    assert unknown.status_code == 422 and "model" in unknown.json()["detail"]
    bad_arg = client.post("/api/v1/jobs", json={**JOB, "model_args": {"wings": 2}})
    assert bad_arg.status_code == 422 and bad_arg.json()["detail"].startswith("model.args.wings:")
    hyper = client.post("/api/v1/jobs", json={**JOB, "hyperparameters": {"momentum": 0.9}})
    assert hyper.status_code == 422 and "hyperparameters.momentum" in hyper.json()["detail"]
    bad_schedule = client.post("/api/v1/jobs", json={**JOB, "schedule": "zigzag"})
    assert bad_schedule.status_code == 422 and "schedule" in bad_schedule.json()["detail"]
    two_rules = client.post("/api/v1/jobs", json={**JOB, "stop": {"steps": 3, "epochs": 1}})
    assert two_rules.status_code == 422 and two_rules.json()["detail"].startswith("length: give exactly one")
    uneven = client.post("/api/v1/jobs", json={**JOB, "workers": 3, "nodes": 2})
    assert uneven.status_code == 422 and "nodes: 2 hosts cannot share the job's 3 worker processes" in uneven.json()["detail"]
    assert client.post("/api/v1/jobs", json={**JOB, "max_attempts": 0}).status_code == 422
    both = client.post("/api/v1/jobs", json={**JOB, "levels": [{"workers": 2, "bandwidth": 1e9}]})
    assert both.status_code == 422 and "levels" in both.json()["detail"]
    assert client.get("/api/v1/jobs/999999").status_code == 404
    assert client.get("/api/v1/jobs/99999999999999").status_code == 422


def test_reaper_retries_a_job_whose_heartbeat_is_stale_then_fails_it_out_of_attempts(client, session):
    job = submit(client)  # max_attempts 2 by default

    def lose_its_worker() -> dict:
        stale = jobs.utcnow() - timedelta(hours=1)
        session.execute(update(Job).where(Job.id == job["id"]).values(status=JobStatus.RUNNING, started_at=stale, heartbeat_at=stale,
                                                                      worker_hostname="gone-host", pgid=None))
        session.commit()
        return client.get(f"/api/v1/jobs/{job['id']}").json()

    retried = lose_its_worker()
    assert retried["status"] == "queued" and retried["attempt"] == 2 and retried["error"] is None
    first, second = retried["attempts"]
    assert first["status"] == "failed" and "gone-host stopped sending heartbeats" in first["error"]
    assert (second["trigger"], second["status"]) == ("auto", "queued")
    log = session.scalars(select(JobEvent.payload).where(JobEvent.job_id == job["id"], JobEvent.kind == "status")).all()
    assert "attempt 2 resumes from the newest checkpoint" in log[-1]["message"]
    failed = lose_its_worker()
    assert failed["status"] == "failed" and "heartbeat" in failed["error"] and "no automatic attempt left of 2" in failed["error"]
    again = client.post(f"/api/v1/jobs/{job['id']}/retry").json()  # a manual retry: a new count
    assert again["status"] == "queued" and again["attempt"] == 3 and again["attempts"][-1]["trigger"] == "manual"
    assert lose_its_worker()["status"] == "queued"


def test_empty_run_data(client):
    job = submit(client)
    timeline = client.get(f"/api/v1/jobs/{job['id']}/timeline").json()
    assert timeline["events"] == [] and timeline["total"] == 0 and timeline["steps"] == []
    assert client.get(f"/api/v1/jobs/{job['id']}/metrics").json() == {"points": [], "total": 0, "downsampled": False}


def test_unreachable_broker_fails_the_job_with_503(client, monkeypatch):
    monkeypatch.setenv("PIPEBOARD_BROKER_URL", "redis://127.0.0.1:9/0")  # nothing listens there
    from pipeboard.app.core.config import get_settings

    get_settings.cache_clear()
    try:
        refused = client.post("/api/v1/jobs", json=JOB)
    finally:
        monkeypatch.delenv("PIPEBOARD_BROKER_URL")
        get_settings.cache_clear()
    assert refused.status_code == 503 and refused.json()["detail"].startswith("broker: cannot queue")
    failed = client.get("/api/v1/jobs", params={"status": "failed"}).json()
    assert failed["count"] == 1 and "broker" in failed["data"][0]["error"]
