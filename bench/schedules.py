"""torch's schedules in pipeboard: oracles and measured speed.

    .venv/bin/python bench/schedules.py [--part oracles|runtime|both] [--pairs N] [--steps N]
        [--models mlp,gpt2-text] [--schedules zbv,dualpipev,interleaved-zb,looped-bfs]

``--part oracles`` (seconds): for each new schedule (and interleaved-1f1b) at (p, m) = (2, 8),
(4, 8), (4, 16):
- whether its compute order is torch's own, action for action (torch's schedule classes built on
  stand-in stages, no process group, their ``pipeline_order`` read);
- the unit steps torch's ``_simulate_comms_compute`` takes for torch's order and for ours, each
  lowered with torch's ``_add_send_recv`` (a DualPipeV pair as its two halves: torch's simulator
  cannot schedule a pair);
- pipeboard's simulated bubble at the Zero Bubble paper's unit times (T_F = T_B = T_W = 1 per
  stage, chunks splitting them evenly; idle time over compute, 3m) next to the analytic one:
  1F1B (p - 1)/m, ZB-H1 a third of it, two-chunk interleaving and looped BFS (p - 1)/(2m), ZB-V
  and interleaved ZB (p - 1)/(6m); dualpipev with its pairs in sequence (how pipeboard's runtime
  runs them, on CPU as everywhere) and overlapped (what a runtime that overlaps them would get).

``--part runtime``: samples/s of each schedule against 1f1b, 2 workers, in alternating pairs
(1f1b first in even pairs, second in odd ones), on the zoo's mlp (8 x 1,024; batch 64 in 8
microbatches) and gpt2-text (4 blocks of 64; batch 32 in 8); prints each pair's ratio and their
median. The processor is printed first. The machine may be shared: read the paired ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

# bench/ holds scripts named like stdlib modules (profile.py): keep it off the import path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402
from pipeboard.trainer.schedule import build  # noqa: E402
from pipeboard.trainer.schedule.torch_reference import TORCH_CLASSES, our_rows, torch_rows, torch_steps, unit_bubble  # noqa: E402

NEW = ("zbv", "dualpipev", "interleaved-zb", "looped-bfs")
CONFIGS = ((2, 8), (4, 8), (4, 16))
ANALYTIC = {
    "1f1b": lambda p, m: (p - 1) / m,
    "zb-h1": lambda p, m: (p - 1) / (3 * m),
    "interleaved-1f1b": lambda p, m: (p - 1) / (2 * m),
    "looped-bfs": lambda p, m: (p - 1) / (2 * m),
    "zbv": lambda p, m: (p - 1) / (6 * m),
    "interleaved-zb": lambda p, m: (p - 1) / (6 * m),
    "dualpipev": lambda p, m: (p - 1) / (6 * m),
}
MODELS = {
    "mlp": dict(model="mlp", model_args={"depth": 8, "width": 1024}, batch_size=64, microbatches=8),
    "gpt2-text": dict(model="gpt2-text", model_args={"layers": 4, "dim": 64}, batch_size=32, microbatches=8),
}


def oracles() -> None:
    print(f"{'schedule':<17} {'(p, m)':<8} {'order':<10} {'torch steps':>11} {'ours':>5}   "
          f"{'bubble':>7} {'analytic':>8}")
    for name in NEW + ("interleaved-1f1b",):
        placement = TORCH_CLASSES[name][1]
        for p, m in CONFIGS:
            options = {"batch_weight_grads": False} if name in ("interleaved-1f1b", "looped-bfs") else {}
            ours = our_rows(build(name, p, m, **options))
            theirs = torch_rows(name, p, m)
            same = "same" if ours == theirs else "DIFFERENT"
            bubble = unit_bubble(name, p, m, **options)
            print(f"{name:<17} {str((p, m)):<8} {same:<10} {torch_steps(theirs, p, placement):>11} "
                  f"{torch_steps(ours, p, placement):>5}   {bubble:>7.4f} {ANALYTIC[name](p, m):>8.4f}")
    for name in ("1f1b", "zb-h1"):
        for p, m in CONFIGS:
            options = {"batch_weight_grads": False} if name == "1f1b" else {}
            print(f"{name:<17} {str((p, m)):<8} {'-':<10} {'-':>11} {'-':>5}   "
                  f"{unit_bubble(name, p, m, **options):>7.4f} {ANALYTIC[name](p, m):>8.4f}")
    from pipeboard.trainer.schedule import costs_uniform, simulate

    print("dualpipev at unit times, span of the iteration against each worker's compute (3m):")
    for p, m in CONFIGS:
        s = build("dualpipev", p, m)
        costs = costs_uniform(p, fwd_s=1.0, bwd_s=2.0, bwd_input_s=1.0, bwd_weight_s=1.0)
        seq, ovl = simulate(s, costs).iteration_time_s, simulate(s, costs, overlap_f_b=True).iteration_time_s
        print(f"  {(p, m)}: pairs in sequence {seq:g}, overlapped {ovl:g}, compute {3 * m}")


def samples_per_s(model: str, schedule: str, steps: int) -> float:
    from pipeboard.trainer.runtime import RunConfig, run_training

    cfg = RunConfig(schedule=schedule, num_stages=2, steps=steps, eval_at_end=False, optimizer="sgd", lr=1e-4,
                    **MODELS[model])
    return float(run_training(cfg)["samples_per_s"])


def runtime(models: list[str], schedules: list[str], pairs: int, steps: int) -> None:
    for model in models:
        print(f"{model}: samples/s, 2 workers, {steps} steps a run, {pairs} alternating pairs with 1f1b")
        for name in schedules:
            ratios, ours, base = [], [], []
            for k in range(pairs):
                order = (name, "1f1b") if k % 2 else ("1f1b", name)
                got = {s: samples_per_s(model, s, steps) for s in order}
                ours.append(got[name])
                base.append(got["1f1b"])
                ratios.append(got[name] / got["1f1b"])
            print(f"  {name:<15} {statistics.median(ours):8.1f} against 1f1b {statistics.median(base):8.1f}: "
                  f"paired ratio median {statistics.median(ratios):.3f} (pairs {', '.join(f'{r:.3f}' for r in ratios)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("oracles", "runtime", "both"), default="oracles")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--models", default="mlp,gpt2-text")
    ap.add_argument("--schedules", default=",".join(NEW))
    args = ap.parse_args()
    models, schedules = args.models.split(","), args.schedules.split(",")
    unknown = [m for m in models if m not in MODELS] + [s for s in schedules if s not in NEW]
    if unknown or args.pairs < 1 or args.steps < 1:
        ap.error(f"unknown model or schedule {unknown[0]!r}" if unknown else "--pairs and --steps must be >= 1")
    print(f"processor: {cpu_name()}")
    t0 = time.perf_counter()
    if args.part in ("oracles", "both"):
        oracles()
    if args.part in ("runtime", "both"):
        runtime(models, schedules, args.pairs, args.steps)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
