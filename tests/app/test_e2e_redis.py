"""End to end with Redis as broker and live channel: submit over HTTP, follow the SSE stream
(served from Redis pub/sub) from the start to its end, then read timeline and metrics."""

from __future__ import annotations

import pytest
import redis

from tests.app.test_e2e_support import SMALL_JOB, Deployment, redis_env
from tests.conftest import require_redis

pytestmark = [pytest.mark.slow, pytest.mark.redis]


@pytest.fixture
def deployment(tmp_path):
    url = require_redis()
    dep = Deployment(redis_env(tmp_path, url), tmp_path)
    try:
        dep.start_server()
        dep.start_worker()
        yield dep
    finally:
        dep.close()


def test_job_over_http_with_live_stream_from_redis(deployment):
    job = deployment.api("POST", "/jobs", json={**SMALL_JOB, "name": "e2e-redis"})
    assert job["status"] == "queued"
    client = redis.Redis.from_url(deployment.env["PIPEBOARD_BROKER_URL"])
    channel = f"{deployment.env['PIPEBOARD_KEY_PREFIX']}pipeboard:job:{job['id']}"
    messages, subscribers = [], 0
    for message in deployment.events(job["id"]):
        messages.append(message)
        if message["event"] == "progress" and not subscribers:
            subscribers = dict(client.pubsub_numsub(channel)).get(channel.encode(), 0)
    assert subscribers >= 1, "the stream should follow the job's Redis channel"
    kinds = [m["event"] for m in messages]
    assert kinds[-1] == "end" and messages[-1]["data"]["status"] == "succeeded", deployment.logs()
    assert [m["data"]["status"] for m in messages if m["event"] == "status"] == ["queued", "running", "succeeded"]
    ids = [int(m["id"]) for m in messages[1:]]
    assert ids == list(range(1, len(ids) + 1))  # nothing lost, nothing repeated
    timeline_events = [row for m in messages if m["event"] == "timeline" for row in m["data"]["events"]]
    measured = deployment.api("GET", f"/jobs/{job['id']}/timeline", params={"limit": 100000})
    assert measured["total"] == len(timeline_events) > 0  # the stream carried every measured event
    assert {e["worker"] for e in measured["events"]} == {0, 1}
    metrics = deployment.api("GET", f"/jobs/{job['id']}/metrics")
    assert any("loss" in p["values"] for p in metrics["points"])
    assert deployment.api("GET", f"/jobs/{job['id']}")["status"] == "succeeded"
