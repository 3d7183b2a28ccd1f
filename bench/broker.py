"""Pick-up latency of a real Celery worker on the embedded SQLite broker and on Redis.

For each broker: start `celery worker` (thread pool, as `pipeboard up` does) in a temp deployment,
wait until it answers, then send `pipeboard.ping` tasks one at a time. Pick-up latency = the
worker's clock when the task body starts minus the sender's clock just before publishing (same
machine, same clock). Prints the median and the 90th percentile over N tasks, and the full round
trip (publish to result read back). Timings on a shared 2-core machine are noisy.

    .venv/bin/python bench/broker.py [--tasks 20] [--redis-url redis://127.0.0.1:6379/15]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeboard.app.core.config import Settings  # noqa: E402
from pipeboard.app.core.db import make_engine  # noqa: E402
from pipeboard.app.models import Base  # noqa: E402
from pipeboard.app.worker import make_celery, worker_argv  # noqa: E402


def measure(name: str, env: dict[str, str], tasks: int) -> None:
    settings = Settings(**{k.removeprefix("PIPEBOARD_").lower(): v for k, v in env.items()})
    engine = make_engine(settings.database_url)
    Base.metadata.create_all(engine)  # the worker's heartbeat writes there
    engine.dispose()
    client = make_celery(settings)
    log = open(Path(settings.data_dir) / "worker.log", "wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "pipeboard.app.worker:celery_app",
         *worker_argv(concurrency=2, hostname=f"bench-{name}@%h", loglevel="warning")],
        cwd=ROOT, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # ready: one full round trip (not measured)
            try:
                client.send_task("pipeboard.ping").get(timeout=2, interval=0.01)
                break
            except Exception:
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{name}: worker did not start; see {log.name}")
        pickup, round_trip = [], []
        for i in range(tasks):
            time.sleep(0.05)  # an idle worker, as a freshly submitted job finds it
            sent = time.time()
            reply = client.send_task("pipeboard.ping", args=[i]).get(timeout=30, interval=0.005)
            done = time.time()
            assert reply["args"] == [i]
            pickup.append(reply["worker_time"] - sent)
            round_trip.append(done - sent)
        q90 = statistics.quantiles(pickup, n=10)[-1]
        print(f"{name:<7} pick-up median {statistics.median(pickup) * 1000:7.1f} ms   p90 {q90 * 1000:7.1f} ms   "
              f"round trip median {statistics.median(round_trip) * 1000:7.1f} ms   ({tasks} tasks)")
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        client.close()
        log.close()


def redis_reachable(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=2).ping())
    except Exception:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--redis-url", default=os.environ.get("PIPEBOARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"))
    args = parser.parse_args()
    print(f"pick-up latency of a real worker (median over {args.tasks} tasks; shared machine: noisy)")
    with tempfile.TemporaryDirectory(prefix="pipeboard-bench-") as tmp:
        measure("sqlite", {"PIPEBOARD_DATA_DIR": f"{tmp}/sqlite"}, args.tasks)
        if redis_reachable(args.redis_url):
            measure("redis", {
                "PIPEBOARD_DATA_DIR": f"{tmp}/redis",
                "PIPEBOARD_BROKER_URL": args.redis_url,
                "PIPEBOARD_RESULT_BACKEND": args.redis_url,
                "PIPEBOARD_KEY_PREFIX": f"pbbench-{uuid.uuid4().hex[:8]}:",
            }, args.tasks)
        else:
            print(f"redis   skipped: {args.redis_url} unreachable")


if __name__ == "__main__":
    main()
