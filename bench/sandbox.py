"""Users' code closed in, measured: upload bombs against /health, what a factory can read
with the sandbox off and on, a validation whose setsid child never exits, and the sandbox's cost.

Parts (each on real deployments: `pipeboard up --workers 1 --concurrency 1` on a private SQLite
database, driven over the REST API; users' tokens from `pipeboard token create`):
  bombs    a .tar.bz2 of 3 GB of zeros and a .tar.gz of 10 GB, each as one declared member and as
           bytes hidden after the archive's end, uploaded while GET /health is probed every 0.7 s
           with a 1 s timeout: the answer and its time, and how many probes answered
           (bench/sandbox_bombs.py)
  reads    user B's factory (validation, then a job) reads user A's unpacked context, the database
           file, the token table, the worker's /proc environ and settings, and its own file and data;
           with PIPEBOARD_SANDBOX=off, then on (bench/sandbox_users.py)
  setsid   a factory whose setsid child never exits, validated with a 5 s limit, a job queued behind
           it (worker concurrency 1): when the validation failed, processes left, when the job started
           (bench/sandbox_limits.py)
  cost     5 alternating pairs (off, on) of a job (mlp-digits, 2 stages, 1f1b, 300 steps; a new batch
           size per pair, so each job profiles: the sandboxed phase): job start (POST to its first
           measured step) and samples/s; medians, per-pair differences and the spread
           (bench/sandbox_overhead.py)

    .venv/bin/python bench/sandbox.py [--parts bombs,reads,setsid,cost] [--pairs 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sandbox_bombs import bombs_part  # noqa: E402
from bench.sandbox_deploy import chosen_parts  # noqa: E402
from bench.sandbox_limits import setsid_part  # noqa: E402
from bench.sandbox_overhead import cost_part  # noqa: E402
from bench.sandbox_users import reads_part  # noqa: E402
from bench.service_probe import processor  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="bombs,reads,setsid,cost")
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    parts = chosen_parts(parser, args.parts, ("bombs", "reads", "setsid", "cost"))
    from pipeboard.app.services import sandbox

    print(f"processor: {processor()}")
    print(f"bubblewrap: {sandbox.probe() or 'works here'}")
    with tempfile.TemporaryDirectory(prefix="pipeboard-bench-sandbox-") as tmp:
        runs = {"bombs": bombs_part, "reads": reads_part, "setsid": setsid_part,
                "cost": lambda where: cost_part(where, args.pairs)}
        for part in parts:
            runs[part](Path(tmp))


if __name__ == "__main__":
    main()
