"""How fast the schedule builder, validator and simulator are on a large pipeline.

    .venv/bin/python bench/simulate.py [--stages 64] [--microbatches 1024] [--schedule 1f1b] [--repeat 3]

Prints wall and CPU seconds of each part (best of --repeat). The target is a 64-stage,
1,024-microbatch 1F1B simulation in under 1 s. On a shared machine wall time is noisy, so the
CPU time of this process is printed beside it, with the load average.
"""

from __future__ import annotations

import argparse
import os
import time

from trainer.schedule import build
from trainer.schedule.costs import costs_uniform
from trainer.schedule.simulate import simulate
from trainer.schedule.validate import validate


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
    args = parser.parse_args()
    p, m = args.stages, args.microbatches
    print(f"{args.schedule}: {p} stages, {m} microbatches; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")

    wall, cpu, schedule = best(1, lambda: build(args.schedule, p, m))
    n = sum(len(a) for a in schedule.actions)
    print(f"  build       {wall:7.3f} s wall {cpu:7.3f} s cpu   ({n} actions)")
    costs = costs_uniform(p, 1e-3, 2e-3)
    wall, cpu, result = best(args.repeat, lambda: simulate(schedule, costs))
    print(f"  simulate    {wall:7.3f} s wall {cpu:7.3f} s cpu   (target < 1 s; {n / wall / 1e6:.2f} M actions/s)")
    wall_t, cpu_t, timeline = best(1, lambda: result.timeline)
    print(f"  timeline    {wall_t:7.3f} s wall {cpu_t:7.3f} s cpu   ({len(timeline)} events, built on first use)")
    wall, cpu, _ = best(1, lambda: validate(schedule))
    print(f"  validate    {wall:7.3f} s wall {cpu:7.3f} s cpu")
    analytic = (p - 1) / (m + p - 1)
    print(
        f"  bubble {result.bubble_fraction:.5f} (analytic (p-1)/(m+p-1) = {analytic:.5f}), "
        f"iteration {result.iteration_time_s:.3f} s, {result.throughput:.1f} {result.throughput_unit}"
    )


if __name__ == "__main__":
    main()
