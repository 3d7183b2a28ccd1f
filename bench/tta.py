"""Time to accuracy on the image task: pipedream, 1f1b, gpipe and dp on 2 workers each.

    .venv/bin/python bench/tta.py [--rounds 2] [--target 0.9] [--eval-every 3] [--max-steps 300]
        [--batch-size 64] [--microbatches 4] [--schedules pipedream,1f1b,gpipe,dp] [--data DIR]

The zoo's ``resnet18-images`` (a transformers ResNet-18 layout on scikit-learn's digits written
as 32x32 PNG files, decoded in DataLoader workers; its own optimizer, learning rate and loader
workers) trains with ``run_training`` under each schedule on 2 worker processes (pipelines: 2
stages; dp: 2 replicas of the whole model), with the same batch size, microbatches and seed, until
its validation accuracy reaches ``--target`` (default: the task's, 0.9), measured every
``--eval-every`` steps, or ``--max-steps`` pass. The schedules run in turn, the order reversed
every other round.

Printed per schedule (median over rounds; each round's figures too): whether the target was
reached (in how many rounds), the time to target as the runtime reports it (the wall time of the
first evaluation at or above the target, from the launch: worker start-up, model building and
every evaluation so far included), the same from the end of the first step (start-up left out),
the step it was reached at, the steady-state samples/s the runtime reports (steps after the first
tenth; evaluations fall inside that span, and pipedream drains its pipeline at each, so it is below
the training rate), the training rate between evaluations (ms per step: the median step interval
not spanning an evaluation), the final accuracy, and each schedule's time relative to dp's (paired:
the median of per-round ratios). The machine is shared: read the ratios, not single figures.
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

from pipeboard.trainer.allocator import prefer_huge_pages  # noqa: E402

prefer_huge_pages()  # as `pipeboard train` runs (before torch allocates)

import torch  # noqa: E402

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402
from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.runtime.run_config import SCHEDULES  # noqa: E402
from pipeboard.trainer.sink import ListSink  # noqa: E402

MODEL = "resnet18-images"
WORKERS = 2


def one_run(args, schedule: str, target: float) -> dict:
    layout = dict(workers=WORKERS) if schedule == "dp" else dict(num_stages=WORKERS)
    sink = ListSink()
    s = run_training(RunConfig(model=MODEL, data=args.data, schedule=schedule, batch_size=args.batch_size,
                               microbatches=args.microbatches, seed=args.seed, target=target,
                               eval_every=args.eval_every, max_steps=args.max_steps, **layout), sink)
    done = {m.step: m.wall_s for m in sink.metrics if "metric" not in m.values}  # step k+1 done at wall_s
    evaluated = {e["step"] for e in s["evaluations"]}
    # intervals between consecutive steps, leaving out those with an evaluation between them
    gaps = [done[k] - done[k - 1] for k in sorted(done) if k - 1 in done and k - 1 not in evaluated]
    hit = next((e for e in s["evaluations"] if e["metric"] >= target), None)
    first = done.get(min(done, default=0))
    return {
        "reached": s["reached_target"],
        "tta_s": s["time_to_target_s"],
        "tta_from_first_step_s": s["time_to_target_s"] - first if hit and first is not None else None,
        "step": hit["step"] if hit else None,
        "steps": s["steps"],
        "samples_per_s": s["samples_per_s"],
        "train_samples_per_s": args.batch_size / statistics.median(gaps) if gaps else None,
        "final": s["final_metric"],
    }


def _med(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt(value, spec: str, width: int) -> str:
    return f"{'n/a':>{width}s}" if value is None else f"{value:{width}{spec}}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="rounds of all schedules, the order reversed every other")
    ap.add_argument("--target", type=float, default=None, help="validation accuracy to reach (default: the task's)")
    ap.add_argument("--eval-every", type=int, default=3, help="steps between evaluations")
    ap.add_argument("--max-steps", type=int, default=300, help="give up after this many steps")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--schedules", default="pipedream,1f1b,gpipe,dp", help="comma-separated")
    ap.add_argument("--data", default=None, help="an imagefolder tree (default: the digits as PNG files)")
    args = ap.parse_args()
    schedules = args.schedules.split(",")
    if any(s not in SCHEDULES for s in schedules):
        ap.error(f"--schedules: choose from {', '.join(SCHEDULES)}")
    if min(args.rounds, args.eval_every, args.max_steps, args.batch_size, args.microbatches) < 1:
        ap.error("--rounds, --eval-every, --max-steps, --batch-size and --microbatches must be positive")
    from pipeboard.trainer.zoo import describe

    info = next(d for d in describe() if d["name"] == MODEL)
    target = info["target"] if args.target is None else args.target

    print(f"time to accuracy: {cpu_name()}, {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), "
          f"torch {torch.__version__}")
    print(f"  {MODEL} to validation {info['metric']} {target}, batch {args.batch_size} in {args.microbatches} "
          f"microbatches, {WORKERS} workers (pipelines: {WORKERS} stages; dp: {WORKERS} replicas), seed {args.seed}, "
          f"evaluated every {args.eval_every} steps, at most {args.max_steps} steps")
    res: dict[str, list[dict]] = {s: [] for s in schedules}
    for r in range(args.rounds):
        for s in (schedules if r % 2 == 0 else schedules[::-1]):
            res[s].append(one_run(args, s, target))
        print(f"  round {r + 1}/{args.rounds} done ({', '.join(schedules if r % 2 == 0 else schedules[::-1])})",
              flush=True)

    print(f"\nmedian of {args.rounds} rounds:")
    print(f"  {'schedule':10s} {'reached':>7s} {'tta s':>7s} {'from step 1':>11s} {'at step':>7s} {'steps':>5s} "
          f"{'samples/s':>9s} {'train samples/s':>15s} {'ms/step':>7s} {'final acc':>9s}   tta s per round")
    for s in schedules:
        runs = res[s]
        reached = sum(bool(x["reached"]) for x in runs)
        train = _med(x["train_samples_per_s"] for x in runs)
        print(f"  {s:10s} {f'{reached}/{len(runs)}':>7s} {_fmt(_med(x['tta_s'] for x in runs), '.2f', 7)} "
              f"{_fmt(_med(x['tta_from_first_step_s'] for x in runs), '.2f', 11)} "
              f"{_fmt(_med(x['step'] for x in runs), '.0f', 7)} {_fmt(_med(x['steps'] for x in runs), '.0f', 5)} "
              f"{_fmt(_med(x['samples_per_s'] for x in runs), '.0f', 9)} {_fmt(train, '.0f', 15)} "
              f"{_fmt(args.batch_size / train * 1e3 if train else None, '.1f', 7)} "
              f"{_fmt(_med(x['final'] for x in runs), '.4f', 9)}   "
              + ", ".join("n/a" if x["tta_s"] is None else f"{x['tta_s']:.2f}" for x in runs))
    if "dp" in res:
        print("time to target relative to dp (paired: median of per-round ratios; < 1: faster than dp):")
        for s in schedules:
            if s == "dp":
                continue
            for key, label in (("tta_s", "from launch"), ("tta_from_first_step_s", "from step 1")):
                pairs = [(x[key], y[key]) for x, y in zip(res[s], res["dp"]) if x[key] and y[key]]
                if not pairs:
                    print(f"  {s:10s} {label}: n/a (target not reached in a round by both)")
                    continue
                paired = statistics.median(a / b for a, b in pairs)
                of_medians = statistics.median(a for a, _ in pairs) / statistics.median(b for _, b in pairs)
                print(f"  {s:10s} {label}: {paired:5.2f}x paired, {of_medians:5.2f}x of medians "
                      f"({len(pairs)} round(s) where both reached it)")


if __name__ == "__main__":
    main()
