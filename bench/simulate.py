"""How fast the schedule builder, validator and simulator are on a large pipeline.

    .venv/bin/python bench/simulate.py [--stages 64] [--microbatches 1024] [--schedule 1f1b] [--repeat 3]
        [--process 5]

Prints wall and CPU seconds of each part (best of --repeat): building the schedule (placing and
hoisting the receives included, weight gradients batched as `pipeboard simulate` does by
default), simulating it (target < 1 s; from the build's columns, as the command does), making
its Action lists (on first read) and simulating from them, its timeline, validating it. Then the whole command,
`pipeboard simulate --stages P --microbatches M --schedule S --fwd 1 --bwd 2`, as a process, start
to exit, --process times (median; goal for 64 x 1,024 of 1f1b: under 1.5 s). On a shared machine
wall time is noisy, so CPU time is printed beside it, with the load average and the processor.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pipeboard.trainer.hostinfo import cpu_name
from pipeboard.trainer.schedule import build
from pipeboard.trainer.schedule.action_costs import costs_uniform
from pipeboard.trainer.schedule.simulator import simulate
from pipeboard.trainer.schedule.validator import validate


def best(repeat: int, fn):
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return min(walls), min(cpus), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=1024)
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--process", type=int, default=5, help="whole-command runs (0: none)")
    args = parser.parse_args()
    p, m = args.stages, args.microbatches
    print(f"{args.schedule}: {p} stages, {m} microbatches; {cpu_name()}; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")

    wall, cpu, schedule = best(1, lambda: build(args.schedule, p, m, batch_weight_grads=True))
    n = sum(len(t.code) for t in schedule.columns())
    print(f"  build       {wall:7.3f} s wall {cpu:7.3f} s cpu   ({n} actions, as columns)")
    costs = costs_uniform(p, 1e-3, 2e-3)
    wall, cpu, result = best(args.repeat, lambda: simulate(schedule, costs))
    print(f"  simulate    {wall:7.3f} s wall {cpu:7.3f} s cpu   (target < 1 s; {n / wall / 1e6:.2f} M actions/s; "
          "from the columns, as `pipeboard simulate`)")
    wall, cpu, _ = best(1, lambda: schedule.actions)
    print(f"  lists       {wall:7.3f} s wall {cpu:7.3f} s cpu   (the Action lists, made on first read)")
    wall, cpu, _ = best(args.repeat, lambda: simulate(schedule, costs))
    print(f"  simulate    {wall:7.3f} s wall {cpu:7.3f} s cpu   (from the lists)")
    wall_t, cpu_t, timeline = best(1, lambda: result.timeline)
    print(f"  timeline    {wall_t:7.3f} s wall {cpu_t:7.3f} s cpu   ({len(timeline)} events, built on first use)")
    wall, cpu, _ = best(1, lambda: validate(schedule))
    print(f"  validate    {wall:7.3f} s wall {cpu:7.3f} s cpu")
    analytic = (p - 1) / (m + p - 1)
    print(
        f"  bubble {result.bubble_fraction:.5f} (analytic (p-1)/(m+p-1) = {analytic:.5f}), "
        f"iteration {result.iteration_time_s:.3f} s, {result.throughput:.1f} {result.throughput_unit}"
    )
    if args.process:
        whole_command(args)


def whole_command(args) -> None:
    """`pipeboard simulate` as a user runs it: a new process each time, start-up included."""
    command = [str(Path(sys.executable).with_name("pipeboard")), "simulate", "--stages", str(args.stages),
               "--microbatches", str(args.microbatches), "--schedule", args.schedule, "--fwd", "1", "--bwd", "2"]
    walls, cpus = [], []
    for _ in range(args.process + 1):  # the first run warms the file cache, not counted
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - w0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    walls, cpus = walls[1:], cpus[1:]
    print(f"  `pipeboard simulate` whole process, median of {args.process}: {statistics.median(walls):.3f} s wall "
          f"(min {min(walls):.3f}, max {max(walls):.3f}), {statistics.median(cpus):.3f} s cpu (goal for 64 x 1,024 "
          f"of 1f1b: < 1.5 s)")


if __name__ == "__main__":
    main()
