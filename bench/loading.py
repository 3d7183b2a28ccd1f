"""What real data loading costs a training step: PNG decoding in DataLoader workers vs tensors in memory.

    .venv/bin/python bench/loading.py [--rounds 5] [--steps 20] [--schedule 1f1b] [--stages 2]
        [--batch-size 64] [--microbatches 4] [--width 64] [--data DIR]

The image task (zoo ``resnet18-images``: a transformers ResNet-18 layout, by default at that
layout's own widths, 64 to 512 (the zoo's default of 16 is a narrow copy for quick CPU runs),
default data scikit-learn's digits as 32x32 PNG files) is trained by ``run_training`` in three variants, with
the same model, seed, schedule, batch and steps (factories in bench/loading_tasks.py):

- ``real, loader_workers=<task's>``: every item is a PNG opened, decoded, converted, resized and
  normalised on access, in the task's default number of DataLoader worker processes per loading
  stage (the first stage reads the inputs, the last the targets: each has its own loader);
- ``real, loader_workers=0``: the same decoding, in the training processes themselves;
- ``pre-loaded``: the same tensors decoded once, before training, into a ``TensorDataset``
  (``loader_workers=0``).

The variants run alternating (A, B, C, then C, B, A, ...) for ``--rounds`` rounds. It prints each
variant's steady-state samples/s (the runtime's: the run's steps after the first tenth) and ms per
step, median over rounds, and the ratio real / pre-loaded (paired: the median of the per-round
ratios; and of the medians). The goal: real loading within 5% of pre-loaded (ratio >= 0.95).
All variants read the same samples in the same order, so their final losses must agree; they are
printed as a check. It also times decoding one batch directly (one process, one thread): the
work real loading adds per batch and loading stage. The machine is shared and small: read the
ratios, not single figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# bench/ holds scripts named like stdlib modules (profile.py): keep it off the import path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeboard.trainer.allocator import prefer_huge_pages  # noqa: E402

prefer_huge_pages()  # as `pipeboard train` runs (before torch allocates)

import torch  # noqa: E402

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402
from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.runtime.run_config import SCHEDULES  # noqa: E402
from pipeboard.trainer.spec import load_task  # noqa: E402

TASKS = str(Path(__file__).resolve().with_name("loading_tasks.py"))


def run_cfg(args, factory: str, loader_workers: int | None) -> RunConfig:
    layout = dict(workers=args.stages) if args.schedule == "dp" else dict(num_stages=args.stages)
    return RunConfig(model=f"{TASKS}:{factory}", model_args={"width": args.width, "size": args.size}, data=args.data,
                     schedule=args.schedule, batch_size=args.batch_size, microbatches=args.microbatches,
                     steps=args.steps, seed=args.seed, loader_workers=loader_workers, eval_at_end=False, **layout)


def batch_decode_s(dataset, batch_size: int, repeats: int = 5) -> float:
    """Seconds to read one batch of ``dataset`` item by item and collate it, as a loader does."""
    from torch.utils.data import default_collate

    torch.set_num_threads(1)
    times = []
    for r in range(repeats + 1):
        idx = [(r * batch_size + i) % len(dataset) for i in range(batch_size)]
        t0 = time.perf_counter()
        default_collate([dataset[i] for i in idx])
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])  # the first: imports and file-system caches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of the three variants")
    ap.add_argument("--steps", type=int, default=20, help="training steps per run (22 make an epoch of the digits)")
    ap.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    ap.add_argument("--stages", type=int, default=2, help="pipeline stages (dp: replicas)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--width", type=int, default=64, help="the ResNet's first width (model arg; 64 is ResNet-18's)")
    ap.add_argument("--size", type=int, default=32, help="images are resized to size x size (model arg)")
    ap.add_argument("--data", default=None, help="an imagefolder tree (default: the digits as PNG files)")
    args = ap.parse_args()
    if min(args.rounds, args.steps, args.stages, args.batch_size, args.microbatches) < 1:
        ap.error("--rounds, --steps, --stages, --batch-size and --microbatches must be positive")

    print(f"data loading benchmark: {cpu_name()}, {os.cpu_count()} CPUs "
          f"({len(os.sched_getaffinity(0))} usable), torch {torch.__version__}")
    task = load_task(f"{TASKS}:real", {"width": args.width, "size": args.size}, args.data, args.seed)
    default_workers = task.loader_workers
    print(f"  task resnet18-images: {task.train_size} training images of {tuple(task.train_data[0][0].shape)}, "
          f"decoded by {type(task.train_data).__name__}; task's loader_workers = {default_workers}")
    print(f"  schedule {args.schedule}, {args.stages} {'replicas' if args.schedule == 'dp' else 'stages'}, "
          f"batch {args.batch_size} in {args.microbatches} microbatches, {args.steps} steps per run, seed {args.seed}")
    decode_s = batch_decode_s(task.train_data, args.batch_size)
    print(f"  decoding one batch of {args.batch_size} images in one process, one thread: {decode_s * 1e3:.1f} ms "
          f"(median of 5; every loading stage pays it per batch: the first stage reads the inputs, the last the "
          f"targets)")
    del task

    variants = [
        (f"real, loader_workers={default_workers}", "real", None),
        ("real, loader_workers=0", "real", 0),
        ("pre-loaded, loader_workers=0", "preloaded", 0),
    ]
    rates: dict[str, list[float]] = {v[0]: [] for v in variants}
    losses: dict[str, list[float]] = {v[0]: [] for v in variants}
    for r in range(args.rounds):
        for label, factory, workers in (variants if r % 2 == 0 else variants[::-1]):  # none always first
            s = run_training(run_cfg(args, factory, workers))
            rates[label].append(s["samples_per_s"])
            losses[label].append(s["final_loss"])
        print(f"  round {r + 1}/{args.rounds} done", flush=True)

    base = variants[-1][0]
    print(f"\nsteady state, median of {args.rounds} alternating rounds:")
    print(f"  {'variant':30s} {'samples/s':>10s} {'ms/step':>8s}  {'final loss':>10s}   samples/s per round")
    for label, _, _ in variants:
        med, loss = statistics.median(rates[label]), statistics.median(losses[label])
        print(f"  {label:30s} {med:10.1f} {args.batch_size / med * 1e3:8.1f}  {loss:10.5f}   "
              + ", ".join(f"{x:.0f}" for x in rates[label]))
    print("ratio to pre-loaded (goal: real loading within 5%, >= 0.95):")
    for label, _, _ in variants[:-1]:
        paired = statistics.median(a / b for a, b in zip(rates[label], rates[base]))
        of_medians = statistics.median(rates[label]) / statistics.median(rates[base])
        print(f"  {label:30s} {paired:5.3f} paired, {of_medians:5.3f} of medians "
              f"(ms per step {1 / paired - 1:+.1%} against pre-loaded, paired)")
    spread = max(x for v in losses.values() for x in v) - min(x for v in losses.values() for x in v)
    print(f"final losses of all runs agree to {spread:.2g} (same samples in the same order: expected ~0)")


if __name__ == "__main__":
    main()
