"""Memory per stage as a real run reports it: memory_model's prediction beside the measured peak.

Unlike bench/memory.py (which replays one worker's actions in this process and counts glibc's
bytes in use), this runs the runtime itself (run_training, one process per stage) and reads the
summary's ``memory``: on CPU the measured figure is each stage process's peak resident memory in
a step (``memory_source: rss_peak``), which holds the interpreter and torch's libraries too, so
the table also gives measured minus the smallest measured figure of the same run's processes (the
part that differs between stages) beside the predicted difference.

    .venv/bin/python bench/memory_run.py [--models mlp,transformer-text] [--schedules gpipe,1f1b,pipedream] [--steps 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

# bench/profile.py would shadow the standard library's profile (torch.export imports cProfile)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.sink import NullSink  # noqa: E402

MODEL_ARGS = {"mlp": {"depth": 4, "width": 1024, "samples": 512}}  # others: their zoo defaults


def processor() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,transformer-text")
    ap.add_argument("--schedules", default="gpipe,1f1b,pipedream")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--microbatches", type=int, default=4)
    args = ap.parse_args()
    print(f"processor: {processor()}")
    print(f"{'model':<17} {'schedule':<10} {'stage':>5} {'predicted MiB':>14} {'measured MiB':>13} "
          f"{'pred diff MiB':>14} {'meas diff MiB':>14}  source")
    ratios: list[float] = []
    for model in args.models.split(","):
        for schedule in args.schedules.split(","):
            cfg = RunConfig(model=model, model_args=MODEL_ARGS.get(model, {}), schedule=schedule, num_stages=2,
                            batch_size=args.batch_size, microbatches=args.microbatches, steps=args.steps,
                            eval_at_end=False)
            s = run_training(cfg, NullSink())
            rows = s["memory"]
            low_p = min(r["predicted_bytes"] or 0 for r in rows)
            low_m = min(r["measured_bytes"] or 0 for r in rows)
            for r in rows:
                p, m = r["predicted_bytes"], r["measured_bytes"]
                if p and m:
                    ratios.append(m / p)
                print(f"{model:<17} {schedule:<10} {r['stage']:>5} {(p or 0) / 2**20:>14.2f} {(m or 0) / 2**20:>13.1f} "
                      f"{((p or 0) - low_p) / 2**20:>14.2f} {((m or 0) - low_m) / 2**20:>14.1f}  {s['memory_source']}")
    if ratios:
        print(f"measured / predicted: median {statistics.median(ratios):.2f}, worst {max(ratios, key=lambda r: abs(r - 1)):.2f} "
              f"({len(ratios)} stages)")


if __name__ == "__main__":
    main()
