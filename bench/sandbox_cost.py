"""What the sandbox costs a job now that training runs in it too, and upload bombs against
/health.

Parts (each on real deployments: `pipeboard up --workers 1 --concurrency 1` on a private SQLite
database, driven over the REST API):
  cost     two deployments, PIPEBOARD_SANDBOX=off and on; each first trains one job that is not
           counted (its profile is then cached, so the counted jobs' start is the plan and the
           training phase's: what the sandbox and its relay change); then 5 alternating pairs
           (off, on) of the same job (mlp-digits, 2 stages, 1f1b, batch 64 in 4 microbatches,
           300 steps): job start (POST to its first measured step) and samples/s (the run's
           summary); medians, per-pair differences and ratios, and the unsandboxed runs' spread
  bombs    bench/sandbox.py's (bench/sandbox_bombs.py): a .tar.bz2 of 3 GB of zeros and a .tar.gz of
           10 GB (one declared member, and bytes after the archive's end), and archives under the
           limit, uploaded while GET /health is probed every 0.7 s with a 1 s timeout (its HealthProbe)

    .venv/bin/python bench/sandbox_cost.py [--parts cost,bombs] [--pairs 5] [--steps 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sandbox_bombs import bombs_part  # noqa: E402
from bench.sandbox_deploy import SMALL_JOB, chosen_parts, deployment, seconds_to_first_step, spread  # noqa: E402
from bench.service_probe import Served, finished, processor  # noqa: E402


def timed_job(server: Served, steps: int) -> tuple[float, float, bool]:
    """(seconds from POST to the first measured step, samples/s, trained in the sandbox) of one job."""
    job_id, start = seconds_to_first_step(server, {**SMALL_JOB, "batch_size": 64, "microbatches": 4,
                                                   "stop": {"steps": steps}})
    sandboxed = relayed(server, job_id)  # the run is live: its first step is in
    done = finished(server.http, job_id)
    assert done["status"] == "succeeded", done
    return start, float(done["summary"]["samples_per_s"]), sandboxed


def relayed(server: Served, job_id: int) -> bool:
    """Whether the job's training runs behind the relay, in bwrap, now (its command line names the
    deployment's data folder)."""
    wanted = (b"pipeboard.app.services.run_relay", f"--job-id\0{job_id}\0".encode(), b"bwrap", str(server.data).encode())
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                line = fh.read()
        except OSError:
            continue
        if all(part in line for part in wanted):
            return True
    return False


def cost_part(tmp: Path, pairs: int, steps: int) -> None:
    print(f"\n## Training in the sandbox: {pairs} alternating pairs (off, on); mlp-digits, 2 stages, 1f1b, "
          f"batch 64 in 4 microbatches, {steps} steps; profiles cached by one uncounted job each")
    results: dict[str, list[tuple[float, float, bool]]] = {"off": [], "on": []}
    with ExitStack() as stack:
        servers = {mode: stack.enter_context(deployment(tmp, f"train-cost-{mode}", sandbox=mode)) for mode in ("off", "on")}
        for mode, server in servers.items():
            start, sps, inside = timed_job(server, steps)
            print(f"- warm-up, sandbox {mode} (not counted): start {start:.2f} s, {sps:.1f} samples/s, "
                  f"trained {'in bwrap behind the relay' if inside else 'unsandboxed'}")
        for pair in range(pairs):
            for mode in ("off", "on"):
                results[mode].append(timed_job(servers[mode], steps))
                start, sps, inside = results[mode][-1]
                assert inside == (mode == "on"), (mode, inside)
                print(f"- pair {pair + 1}, sandbox {mode}: start {start:.2f} s, {sps:.1f} samples/s")
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
