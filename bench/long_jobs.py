"""Long jobs' storage and read times: N steps of a 4-stage, 16-microbatch 1F1B pipeline through the
service's writer (the runtime's Reporter into DbSink, the path `pipeboard train --job-id` reports
through), then the job's reads.

What it measures, per database (SQLite file; PostgreSQL where --postgres-url answers):
- database bytes per step (stored values, `storage.usage`; for SQLite also the file with its WAL),
- rows per step (actions, metric points, log events),
- the writer's lag at the end: from the last step's reports to the sink having committed them,
- GET /timeline (the job page's default request, limit 100,000) and GET /steps over HTTP (uvicorn on
  a local port, httpx), the median of 3.

`--policy all` keeps every action of every step (what the service stored before detail windows: the
baseline); `--policy windows` is the default detail policy (docs/storage.md).

The step messages are generated (a regular 1F1B step with 1 ms actions), not trained: this measures
the storage and the reads, not a model. Usage:

    .venv/bin/python bench/long_jobs.py --steps 5000 --policy all,windows
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES, MICROBATCHES = 4, 16


def processor() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    get = lambda k: fields.get(k, "?").strip()  # noqa: E731
    return f"{get('Model name')} (family {get('CPU family')}, model {get('Model')}), {os.cpu_count()} CPUs"


def step_messages(k: int) -> list[tuple]:
    """One 1F1B step: per stage, per microbatch F, B and the transfers, 1 ms apart; one message per rank."""
    t0 = k * 0.2
    out = []
    for rank in range(STAGES):
        events, t = [], t0 + rank * 0.001
        for mb in range(MICROBATCHES):
            events += [("F", rank, mb, t, t + 0.001, k), ("send_act", rank, mb, t + 0.001, t + 0.0012, k),
                       ("recv_grad", rank, mb, t + 0.0012, t + 0.0014, k), ("B", rank, mb, t + 0.0015, t + 0.0035, k)]
            t += 0.004
        events.append(("step", rank, -1, t, t + 0.001, k))
        out.append(("step", rank, k, t0 + 0.07, 0.06, [1.0] if rank == STAGES - 1 else [], 10_000_000, events))
    return out


def write_job(url: str, steps: int, policy_name: str) -> dict:
    os.environ["PIPEBOARD_DATABASE_URL"] = url
    from pipeboard.app.core.config import get_settings
    from pipeboard.app.core.db import get_sessionmaker, make_engine, reset_engine
    from pipeboard.app.models import Base, Job, JobStatus
    from pipeboard.app.services.run_sink import DbSink
    from pipeboard.trainer.runtime.detail import DetailPolicy
    from pipeboard.trainer.runtime.report import Reporter

    get_settings.cache_clear()
    reset_engine()
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    engine.dispose()
    with get_sessionmaker()() as s:
        job = Job(name=f"long-{policy_name}", spec={"model": "bench"}, status=JobStatus.RUNNING)
        s.add(job)
        s.commit()
        job_id = job.id
    policy = DetailPolicy(first=10**9) if policy_name == "all" else DetailPolicy()
    sink = DbSink(job_id, own_group=False)
    reporter = Reporter(sink, STAGES, batch_size=64, metric_name="accuracy", detail=policy)
    for rank in range(STAGES):
        reporter.handle(("ready", rank, [rank], 0, 1000 + rank, 0, steps, steps, None, "bench"))
    started = time.perf_counter()
    for k in range(steps):
        for msg in step_messages(k):
            reporter.handle(msg)
    handled = time.perf_counter()
    reporter.maybe_flush(force=True)
    lag = time.perf_counter() - handled
    sink.close()
    with get_sessionmaker()() as s:
        s.get(Job, job_id).status = JobStatus.SUCCEEDED
        s.commit()
    return {"job_id": job_id, "write_s": handled - started, "lag_s": lag}


def serve(url: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PIPEBOARD_DATABASE_URL": url, "PIPEBOARD_AUTH": "false", "PIPEBOARD_READ_AUTH": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", "pipeboard.app.main:create_app", "--port", str(port), "--log-level", "warning"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    import httpx

    base = f"http://127.0.0.1:{port}/api/v1"
    for _ in range(300):
        try:
            httpx.get(f"{base}/health", timeout=1)
            return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the API did not start")


def timed_get(base: str, path: str) -> float:
    import httpx

    times = []
    for _ in range(3):
        t = time.perf_counter()
        response = httpx.get(base + path, timeout=300)
        response.raise_for_status()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(url: str, steps: int, policy_name: str) -> dict:
    written = write_job(url, steps, policy_name)
    from pipeboard.app.core.db import get_sessionmaker
    from pipeboard.app.services import storage

    with get_sessionmaker()() as s:
        usage = storage.usage(s, written["job_id"])
        file_bytes = storage.database_file_bytes(s)
    proc, base = serve(url)
    try:
        job = written["job_id"]
        timeline_s = timed_get(base, f"/jobs/{job}/timeline?limit=100000")
        steps_s = timed_get(base, f"/jobs/{job}/steps")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {**written, "bytes_per_step": usage["bytes"] / steps, "rows_per_step": usage["rows"] / steps,
            "file_bytes_per_step": None if file_bytes is None else file_bytes / steps,
            "detail_steps": usage["detail_steps"], "timeline_s": timeline_s, "steps_s": steps_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--policy", default="all,windows", help="all (every action: the baseline), windows, or both")
    parser.add_argument("--postgres-url", default=os.environ.get("PIPEBOARD_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
                        help="PostgreSQL to measure too (empty: SQLite only)")
    args = parser.parse_args()
    print(f"processor: {processor()}")
    print(f"{args.steps} steps, {STAGES} stages x {MICROBATCHES} microbatches, {STAGES * (MICROBATCHES * 4 + 1)} actions a step")
    for policy in args.policy.split(","):
        targets = [("sqlite", f"sqlite:///{tempfile.mkdtemp()}/bench.sqlite")]
        if args.postgres_url:
            from pipeboard.app.core.db import private_schema

            targets.append(("postgres", private_schema(args.postgres_url, prefix="pblj")[0]))
        for name, url in targets:
            r = measure(url, args.steps, policy)
            file_part = f", file {r['file_bytes_per_step']:.0f} B/step" if r["file_bytes_per_step"] else ""
            print(f"{policy:8s} {name:8s}: {r['bytes_per_step']:.0f} B/step{file_part}, {r['rows_per_step']:.2f} rows/step, "
                  f"detail {r['detail_steps']} steps, writer lag {r['lag_s']:.3f} s, GET /timeline {r['timeline_s']:.3f} s, "
                  f"GET /steps {r['steps_s']:.3f} s")


if __name__ == "__main__":
    main()
