"""Time to accuracy on the image task: pipedream, 1f1b, gpipe and data parallelism, one bench run.

    .venv/bin/python bench/tta.py [--rounds 1] [--target 0.9] [--eval-every 5] [--data DIR]

The zoo's ``resnet18-images`` (a transformers ResNet-18 layout; default data scikit-learn's
digits as 32x32 PNG files, decoded per item in DataLoader workers) trained to ``--target``
validation accuracy on 2 workers each: the pipelines as 2 stages, ``dp`` as 2 replicas
(DistributedDataParallel), with the same batch, microbatches, seed and evaluation cadence.
``time_to_target_s`` is the runtime's: training wall time from the first step until the
evaluation that met the target (evaluations are not counted twice: the clock is the workers').
Printed per schedule: reached or not, time to target, steps, steady samples/s, final accuracy,
and the time relative to dp; the schedules' order alternates across rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

# bench/ holds scripts named like stdlib modules (profile.py): keep it off the import path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.allocator import prefer_huge_pages  # noqa: E402

prefer_huge_pages()  # as `pipeboard train` runs (before torch allocates)

import torch  # noqa: E402

from trainer.runtime import RunConfig, run_training  # noqa: E402

SCHEDULES = ("pipedream", "1f1b", "gpipe", "dp")


def cpu_name() -> str:
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def run(schedule: str, args) -> dict:
    layout = {"workers": 2} if schedule == "dp" else {"num_stages": 2}
    cfg = RunConfig(model="resnet18-images", model_args={"width": args.width}, data=args.data, schedule=schedule,
                    batch_size=args.batch_size, microbatches=args.microbatches, target=args.target,
                    eval_every=args.eval_every, max_steps=args.max_steps, seed=args.seed, **layout)
    return run_training(cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--target", type=float, default=0.9, help="validation accuracy to reach")
    ap.add_argument("--eval-every", type=int, default=5, help="steps between evaluations")
    ap.add_argument("--max-steps", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--width", type=int, default=16, help="the ResNet's first width (model arg)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=None, help="an imagefolder tree (default: the digits as PNG files)")
    args = ap.parse_args()
    print(f"time-to-accuracy benchmark: {cpu_name()}, {len(os.sched_getaffinity(0))} usable CPUs, "
          f"torch {torch.__version__}")
    print(f"  resnet18-images (width {args.width}) to accuracy {args.target}, 2 workers, batch {args.batch_size} in "
          f"{args.microbatches} microbatches, evaluation every {args.eval_every} steps, seed {args.seed}")
    results: dict[str, list[dict]] = {s: [] for s in SCHEDULES}
    for r in range(args.rounds):
        for schedule in (SCHEDULES if r % 2 == 0 else SCHEDULES[::-1]):
            results[schedule].append(run(schedule, args))
        print(f"  round {r + 1}/{args.rounds} done", flush=True)
    dp = [s["time_to_target_s"] for s in results["dp"] if s["time_to_target_s"] is not None]
    dp_time = statistics.median(dp) if dp else None
    print(f"\n{'schedule':10s} {'reached':>7s} {'to target s':>11s} {'steps':>6s} {'samples/s':>10s} {'accuracy':>8s} "
          f"{'vs dp':>6s}")
    for schedule in SCHEDULES:
        runs = results[schedule]
        times = [s["time_to_target_s"] for s in runs if s["time_to_target_s"] is not None]
        t = statistics.median(times) if times else None
        steps = statistics.median(s["steps"] for s in runs)
        sps = statistics.median(s["samples_per_s"] for s in runs)
        acc = statistics.median(s["final_metric"] for s in runs)
        rel = f"{t / dp_time:5.2f}x" if t is not None and dp_time else "  n/a"
        print(f"{schedule:10s} {len(times):3d}/{len(runs):<3d} {t if t is not None else float('nan'):11.1f} {steps:6.0f} "
              f"{sps:10.1f} {acc:8.3f} {rel:>6s}")


if __name__ == "__main__":
    main()
