"""What the sandbox costs a job now that training runs in it too, and upload bombs against
/health.

Parts (each on real deployments: uvicorn and a Celery worker on a private SQLite database):
  cost     two deployments, PIPEBOARD_SANDBOX=off and on; each first trains one job that is not
           counted (its profile is then cached, so the counted jobs' start is the plan and the
           training phase's: what the sandbox and its relay change); then 5 alternating pairs
           (off, on) of the same job (mlp-digits, 2 stages, 1f1b, batch 64 in 4 microbatches,
           300 steps): job start (POST to its first measured step) and samples/s (the run's
           summary); medians, per-pair differences and ratios, and the unsandboxed runs' spread
  bombs    bench/sandbox.py's: a .tar.bz2 of 3 GB of zeros and a .tar.gz of 10 GB (one declared
           member, and bytes after the archive's end), and archives under the limit, uploaded while
           GET /health is probed every 0.7 s with a 1 s timeout (its HealthProbe)

    .venv/bin/python bench/sandbox_cost.py [--parts cost,bombs] [--pairs 5] [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.sandbox import bombs_part, chosen_parts, deployment, processor, spread, wait_job  # noqa: E402
from tests.app.test_e2e_support import SMALL_JOB  # noqa: E402


def timed_job(dep, steps: int) -> tuple[float, float, bool]:
    """(seconds from POST to the first measured step, samples/s, trained in the sandbox) of one job."""
    began = time.monotonic()
    job = dep.api("POST", "/jobs", json={**SMALL_JOB, "batch_size": 64, "microbatches": 4, "stop": {"steps": steps}})
    for message in dep.events(job["id"], timeout=600, until="timeline"):
        if message["event"] == "end":
            raise RuntimeError(f"job ended early: {message['data']}")
    start = time.monotonic() - began
    sandboxed = relayed(dep, job["id"])  # the run is live: its first step is in
    done = wait_job(dep.http_client, job["id"])
    assert done["status"] == "succeeded", done
    return start, float(done["summary"]["samples_per_s"]), sandboxed


def relayed(dep, job_id: int) -> bool:
    """Whether the job's training runs behind the relay, in bwrap, now (its command line names the
    deployment's data folder)."""
    import os

    from pipeboard.app.core.config import settings_from_env

    data_dir = str(settings_from_env(dep.env).data_dir).encode()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                line = fh.read()
        except OSError:
            continue
        if b"pipeboard.app.services.run_relay" in line and f"--job-id\0{job_id}\0".encode() in line \
                and b"bwrap" in line and data_dir in line:
            return True
    return False


def cost_part(tmp: Path, pairs: int, steps: int) -> None:
    print(f"\n## Training in the sandbox: {pairs} alternating pairs (off, on); mlp-digits, 2 stages, 1f1b, "
          f"batch 64 in 4 microbatches, {steps} steps; profiles cached by one uncounted job each")
    deps = {mode: deployment(tmp, f"train-cost-{mode}", sandbox=mode) for mode in ("off", "on")}
    managed = [d.running() for d in deps.values()]
    for m in managed:
        m.__enter__()
    try:
        for dep in deps.values():
            dep.http_client = httpx.Client(base_url=dep.url + "/api/v1", timeout=60, headers=dep.http.headers)
        for mode, dep in deps.items():
            start, sps, inside = timed_job(dep, steps)
            print(f"- warm-up, sandbox {mode} (not counted): start {start:.2f} s, {sps:.1f} samples/s, "
                  f"trained {'in bwrap behind the relay' if inside else 'unsandboxed'}")
        results: dict[str, list[tuple[float, float, bool]]] = {"off": [], "on": []}
        for pair in range(pairs):
            for mode in ("off", "on"):
                results[mode].append(timed_job(deps[mode], steps))
                start, sps, inside = results[mode][-1]
                assert inside == (mode == "on"), (mode, inside)
                print(f"- pair {pair + 1}, sandbox {mode}: start {start:.2f} s, {sps:.1f} samples/s")
    finally:
        for m in reversed(managed):
            m.__exit__(None, None, None)
    starts = {m: [r[0] for r in results[m]] for m in results}
    rates = {m: [r[1] for r in results[m]] for m in results}
    extra = [a - b for a, b in zip(starts["on"], starts["off"])]
    print(f"\n- job start: on {spread(starts['on'])} s, off {spread(starts['off'])} s; per pair on - off "
          f"{spread(extra)} s (goal: under 0.5 s more: {'met' if statistics.median(extra) < 0.5 else 'NOT met'} "
          "by the median)")
    ratios = [a / b for a, b in zip(rates["on"], rates["off"])]
    own = (max(rates["off"]) - min(rates["off"])) / statistics.median(rates["off"])
    loss = 1 - statistics.median(ratios)
    print(f"- samples/s: on {spread(rates['on'])}, off {spread(rates['off'])}; on / off per pair {spread(ratios)}; "
          f"the unsandboxed runs' own spread is {own:.1%} of their median (goal: within 2% or within the spread: "
          f"{'met' if loss <= 0.02 or loss <= own else 'NOT met'} by the median ratio)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="cost,bombs")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    parts = chosen_parts(parser, args.parts, ("cost", "bombs"))
    from pipeboard.app.services import sandbox

    print(f"processor: {processor()}")
    print(f"bubblewrap: {sandbox.probe() or 'works here'}")
    with tempfile.TemporaryDirectory(prefix="pipeboard-bench-sandbox-cost-") as tmp:
        for part in parts:
            if part == "cost":
                cost_part(Path(tmp), args.pairs, args.steps)
            else:
                bombs_part(Path(tmp))


if __name__ == "__main__":
    main()
