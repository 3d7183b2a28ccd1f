"""Single-process training of a zoo model until its target: the baseline time-to-accuracy that a
pipelined run is compared with, and the check that each target is reachable in about a minute.

    python -m pipeboard.trainer.zoo.fit [NAME ...] [--seconds 90] [--batch-size N] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch

from pipeboard.trainer.task import Task


@dataclass
class FitResult:
    name: str
    reached: bool
    seconds: float  # training time until the target was met (or until the budget ran out)
    cpu_seconds: float  # this thread's CPU time in those steps (what a busy machine does not inflate)
    epochs: int
    steps: int
    metric: float  # the last validation value


def train_to_target(entry: Task, batch_size: int | None = None, max_seconds: float = 90.0,
                    max_epochs: int = 1000) -> FitResult:
    """Train ``entry.model`` with its declared optimizer, evaluating after every epoch, until the
    metric meets ``entry.target`` or ``max_seconds`` of training have passed (evaluation time is
    not counted)."""
    bs = batch_size or entry.batch_size
    model = entry.model.train()
    opt = entry.make_optimizer(model.parameters())
    trained = 0.0
    cpu = 0.0
    steps = 0
    value = float("nan")
    for epoch in range(max_epochs):
        started, cpu_started = time.perf_counter(), time.thread_time()
        for x, y in entry.train_batches(bs, epoch):
            opt.zero_grad(set_to_none=True)
            entry.loss(model(x), y).backward()
            opt.step()
            steps += 1
        trained += time.perf_counter() - started
        cpu += time.thread_time() - cpu_started
        value = entry.evaluate(model)
        if entry.reached(value) or trained >= max_seconds:
            return FitResult(entry.name, entry.reached(value), trained, cpu, epoch + 1, steps, value)
    return FitResult(entry.name, entry.reached(value), trained, cpu, max_epochs, steps, value)


def main(argv: list[str] | None = None) -> int:
    from pipeboard.trainer import zoo

    parser = argparse.ArgumentParser(prog="python -m pipeboard.trainer.zoo.fit", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="zoo models (default: all)")
    parser.add_argument("--seconds", type=float, default=90.0, help="training-time budget per model")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = args.names or zoo.names()
    unknown = [n for n in names if n not in zoo.names()]
    if unknown:
        print(f"error: unknown zoo model(s) {', '.join(unknown)} (known: {', '.join(zoo.names())})", file=sys.stderr)
        return 2
    print(f"{'model':18} {'metric':>10} {'target':>7} {'reached':>7} {'train s':>8} {'cpu s':>7} {'epochs':>6} {'value':>8}")
    for name in names:
        entry = zoo.get(name, seed=args.seed)
        r = train_to_target(entry, args.batch_size, args.seconds)
        print(f"{name:18} {entry.metric_name:>10} {entry.target:7.3g} {str(r.reached):>7} {r.seconds:8.1f} {r.cpu_seconds:7.1f} "
              f"{r.epochs:6d} {r.metric:8.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
