"""Worker-to-client latency of job events, on the embedded deployment and on Redis.

For each deployment: a real API server (uvicorn) on a temp SQLite database, a job in state
running, an SSE client on `GET /api/v1/jobs/{id}/events`, and a separate "training" process
that reports through `DbSink(job_id)` exactly as `pipeboard train --job-id` does, N progress
events at a steady rate, each carrying the wall clock at which it was handed to the sink.
Latency = the client's clock when the event arrives minus that (same machine, same clock).
Embedded: the stream tails the database; Redis: it follows pub/sub with a database catch-up.
Prints median and p95 against the goals (< 1 s and < 2 s). The machine is shared: noisy.

    .venv/bin/python bench/events.py [--events 100] [--rate 20] [--redis-url redis://127.0.0.1:6379/15]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from pipeboard.app.core.config import Settings  # noqa: E402
from pipeboard.app.core.db import make_engine  # noqa: E402
from pipeboard.app.models import Base, Job, JobStatus  # noqa: E402
from pipeboard.app.services.sse import parse_stream  # noqa: E402

PUBLISHER = """
import sys, time
from pipeboard.app.services.run_sink import DbSink
job_id, n, rate = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
sink = DbSink(job_id, own_group=False)
time.sleep(0.5)  # let the client settle on the stream
for i in range(n):
    sink.on_status("running", f"tick {i}", i=i, sent=time.time())
    time.sleep(1.0 / rate)
sink.on_status("done", "bench over", last=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def measure(name: str, env: dict[str, str], events: int, rate: float) -> dict[str, float]:
    settings = Settings(**{k.removeprefix("PIPEBOARD_").lower(): v for k, v in env.items()})
    engine = make_engine(settings.database_url)
    Base.metadata.create_all(engine)
    from sqlalchemy.orm import Session

    from pipeboard.app.services.tokens import create_token

    with Session(engine) as s:
        job = Job(name="bench", spec={"model": "bench"}, status=JobStatus.RUNNING)
        s.add(job)
        _, token = create_token(s, "bench", "admin")  # reads need a token: the admin's sees this job
        s.commit()
        job_id = job.id
    auth = {"Authorization": f"Bearer {token}"}
    engine.dispose()
    full_env = {**os.environ, **env}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(Path(settings.data_dir) / "server.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "pipeboard.app.main:app", "--port", str(port), "--log-level", "warning"],
                              cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    latencies: list[float] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/api/v1/tokens/me", headers=auth).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
        done = threading.Event()

        def client() -> None:
            with httpx.stream("GET", f"{url}/api/v1/jobs/{job_id}/events", headers=auth,
                              timeout=httpx.Timeout(10, read=120)) as response:
                for message in parse_stream(response.iter_lines()):
                    now = time.time()
                    data = json.loads(message["data"])
                    if "sent" in data:
                        latencies.append(now - data["sent"])
                    if data.get("last"):
                        break
            done.set()

        reader = threading.Thread(target=client, daemon=True)
        reader.start()
        subprocess.run([sys.executable, "-c", PUBLISHER, str(job_id), str(events), str(rate)], cwd=ROOT, env=full_env, check=True)
        done.wait(timeout=30)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=15)
    if len(latencies) != events:
        print(f"{name}: received {len(latencies)} of {events} events")
    med, p95 = statistics.median(latencies), percentile(latencies, 0.95)
    return {"median": med, "p95": p95, "max": max(latencies), "n": len(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0, help="events per second")
    parser.add_argument("--redis-url", default=os.environ.get("PIPEBOARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"))
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="pipeboard-bench-events-") as tmp:
        embedded = {"PIPEBOARD_DATA_DIR": f"{tmp}/embedded"}
        results["embedded (SQLite, DB tail)"] = measure("embedded", embedded, args.events, args.rate)
        redis_env = {
            "PIPEBOARD_DATA_DIR": f"{tmp}/redis",
            "PIPEBOARD_BROKER_URL": args.redis_url,
            "PIPEBOARD_RESULT_BACKEND": args.redis_url,
            "PIPEBOARD_KEY_PREFIX": f"pbbench-{uuid.uuid4().hex[:8]}:",
        }
        try:
            results["redis (pub/sub)"] = measure("redis", redis_env, args.events, args.rate)
        except Exception as exc:
            print(f"redis: skipped ({exc})")
    print(f"worker-to-client event latency, {args.events} events at {args.rate:g}/s (shared 2-core machine: noisy)")
    print(f"{'deployment':<28} {'median':>9} {'p95':>9} {'max':>9}   goal median<1s p95<2s")
    for name, r in results.items():
        ok = "met" if r["median"] < 1.0 and r["p95"] < 2.0 else "MISSED"
        print(f"{name:<28} {r['median'] * 1e3:7.1f}ms {r['p95'] * 1e3:7.1f}ms {r['max'] * 1e3:7.1f}ms   {ok}")


if __name__ == "__main__":
    main()
