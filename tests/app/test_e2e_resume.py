"""A job survives a SIGKILLed stage process, on PostgreSQL with Redis as broker and live channel:
attempt 2 resumes from the checkpoint with the same losses (gpipe), the data reads as one run,
an SSE client that reconnects with Last-Event-ID mid-job sees every event exactly once, and no
process is left behind."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.app.test_e2e_support import FAULT_JOB, Deployment, check_resumed_run, due_for_kill, group_alive, redis_env
from tests.conftest import postgres_schema, require_postgres, require_redis

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]


@pytest.fixture
def deployment(tmp_path):
    redis_url = require_redis()
    database_url, drop = postgres_schema(require_postgres())
    env = {**redis_env(tmp_path, redis_url), "PIPEBOARD_DATABASE_URL": database_url}
    try:
        with Deployment(env, tmp_path).running() as dep:
            yield dep
    finally:
        drop()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_stage_process_resumes_from_the_checkpoint_with_the_same_losses(deployment):
    job_id = deployment.api("POST", "/jobs", json={**FAULT_JOB, "schedule": "gpipe"})["id"]
    messages, pids, killed, groups = [], {}, None, set()
    for message in deployment.events(job_id, timeout=300):  # the first connection: until attempt 2 starts
        messages.append(message)
        data = message["data"]
        if message["event"] == "progress" and data.get("phase") == "running":
            pids = {int(r): p for r, p in data["pids"].items()}
            groups.add(deployment.job_row(job_id).pgid)
        if killed is None and due_for_kill(message):
            os.kill(pids[1], signal.SIGKILL)
            killed = time.monotonic()
        if message["event"] == "attempt" and data["attempt"] == 2:
            break
    assert killed is not None, deployment.logs()
    last_id = int(messages[-1]["id"])
    rest = list(deployment.events(job_id, last_id=last_id, timeout=300))  # resumed with Last-Event-ID
    assert rest[0]["event"] == "open" and rest[0]["data"]["resume_from"] == last_id
    job = check_resumed_run(deployment, job_id, messages + rest[1:], FAULT_JOB["stop"]["steps"])
    assert "stage 1 (rank 1" in job["attempts"][0]["error"] and "killed by SIGKILL" in job["attempts"][0]["error"]
    groups.add(deployment.job_row(job_id).pgid)
    time.sleep(0.5)
    assert not any(group_alive(g) for g in groups) and not any(alive(p) for p in pids.values())
