"""Memory per stage as a real run reports it: memory_model's prediction beside the measured peak.

Runs the runtime itself (run_training, one process per worker) and reads the run summary's
``memory`` (one entry per stage: ``predicted_bytes``, ``measured_bytes``) and ``memory_source``.
On CPU the measured figure is counted bytes (``counted``: trainer/runtime/memory_count.py), the
peak over the run's steps of each worker's parameters, stashed versions, gradients, optimizer
state, the tensors autograd saved and the microbatches in flight. Error is
(predicted - measured) / measured, per stage (a worker's stages share its figure: the first of
them is listed).

Prints (a) the per-stage table under gpipe, 1f1b and pipedream, recompute off, and (b) median and
worst |error| over every model, schedule and recompute setting.

    nice -n 19 .venv/bin/python bench/memory_run.py [--models mlp,mlp-digits,cnn-digits,transformer-text,gpt2-text]
        [--schedules gpipe,1f1b,pipedream,zb-h1,interleaved-1f1b] [--workers 2] [--steps 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

# bench/profile.py would shadow the standard library's profile (torch.export imports cProfile)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402
from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.runtime.run_config import ConfigError  # noqa: E402
from pipeboard.trainer.sink import NullSink  # noqa: E402

MODELS = "mlp,mlp-digits,cnn-digits,transformer-text,gpt2-text"
SCHEDULES = "gpipe,1f1b,pipedream,zb-h1,interleaved-1f1b"
TABLE_A = ("gpipe", "1f1b", "pipedream")
MODEL_ARGS = {"mlp": {"depth": 4, "width": 512, "samples": 512}}  # others: their zoo defaults


def run(model: str, schedule: str, workers: int, recompute: bool, args) -> tuple[list[dict], str]:
    chunks = 2 if schedule == "interleaved-1f1b" else 1
    cfg = RunConfig(model=model, model_args=MODEL_ARGS.get(model, {}), schedule=schedule, num_stages=workers,
                    chunks=chunks, batch_size=args.batch_size, microbatches=args.microbatches, steps=args.steps,
                    eval_at_end=False, recompute=list(range(workers * chunks)) if recompute else None)
    try:
        s = run_training(cfg, NullSink())
    except ConfigError as exc:  # e.g. pipedream refuses weights tied across workers (gpt2-text)
        print(f"  {model} {schedule}: refused: {exc}")
        return [], "?"
    if s.get("memory_predicted_error"):
        print(f"  {model} {schedule}: not predicted: {s['memory_predicted_error']}")
    return s["memory"], s["memory_source"]


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def summary(label: str, errors: list[float]) -> str:
    if not errors:
        return f"{label}: no runs"
    worst = max(errors, key=abs)
    return (f"{label}: median |error| {100 * statistics.median(abs(e) for e in errors):.1f}%, "
            f"worst {pct(worst)} ({len(errors)} stages)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--schedules", default=SCHEDULES)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--all-rows", action="store_true", help="table (a) with recompute on too")
    args = ap.parse_args()
    print(f"processor: {cpu_name()}; load average {os.getloadavg()[0]:.2f}; {args.workers} workers, "
          f"batch {args.batch_size} in {args.microbatches} microbatches, {args.steps} steps")
    results = []  # (model, schedule, recompute, stage, predicted, measured)
    sources = set()
    for model in args.models.split(","):
        for schedule in args.schedules.split(","):
            for recompute in (False, True):
                rows, source = run(model, schedule, args.workers, recompute, args)
                if rows:
                    sources.add(source)
                for r in rows:
                    results.append((model, schedule, recompute, r["stage"], r["predicted_bytes"], r["measured_bytes"]))
    print(f"memory_source: {', '.join(sorted(s or '?' for s in sources))}")

    def err(p, m):
        return (p - m) / m if p and m else None

    print(f"\n(a) per stage, recompute off{' (and on)' if args.all_rows else ''}")
    print(f"{'model':<17} {'schedule':<10} {'rc':>3} {'stage':>5} {'predicted MiB':>14} {'measured MiB':>13} {'error':>8}")
    table_a = []
    for model, schedule, recompute, stage, p, m in results:
        if (recompute and not args.all_rows) or schedule not in TABLE_A:
            continue
        e = err(p, m)
        if e is not None and not recompute:
            table_a.append(e)
        print(f"{model:<17} {schedule:<10} {'on' if recompute else 'off':>3} {stage:>5} {(p or 0) / 2**20:>14.2f} {(m or 0) / 2**20:>13.2f} "
              f"{pct(e) if e is not None else '-':>8}")
    print(summary("(a) gpipe, 1f1b, pipedream, recompute off", table_a))

    print("\n(b) every schedule, recompute off and on")
    for model in args.models.split(","):
        for recompute in (False, True):
            es = [err(p, m) for mo, _, rc, _, p, m in results if mo == model and rc == recompute]
            print("  " + summary(f"{model:<17} recompute {'on ' if recompute else 'off'}", [e for e in es if e is not None]))
    for schedule in args.schedules.split(","):
        es = [err(p, m) for _, sc, _, _, p, m in results if sc == schedule]
        print("  " + summary(f"{schedule:<17}", [e for e in es if e is not None]))
    for recompute in (False, True):
        es = [err(p, m) for _, _, rc, _, p, m in results if rc == recompute]
        print(summary(f"(b) recompute {'on ' if recompute else 'off'}", [e for e in es if e is not None]))
    print(summary("(b) overall", [e for e in (err(p, m) for *_, p, m in results) if e is not None]))
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
