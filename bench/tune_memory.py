"""The tuner's predicted memory per stage against what the runtime counts when the candidate runs.

    .venv/bin/python bench/tune_memory.py [--model llama-text] [--workers 2] [--batch-size 32]
        [--microbatches 4] [--schedules pipedream,1f1b,zb-h1,dp] [--steps 4]

Profiles the model as `pipeboard tune SPEC` does (calibrated, one microbatch size), searches,
then runs each candidate of the given schedules with recompute off for a few steps with the real
runtime and prints, per stage, the tuner's prediction, the runtime's own prediction from its stage
modules and the measured peak (on a CPU the counted bytes: trainer/runtime/memory_count.py).
Prints the processor first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-text")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--schedules", default="pipedream,1f1b,zb-h1,dp")
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    from pipeboard.app.cli.tune import _profile_spec
    from pipeboard.trainer.runtime.run_config import RunConfig
    from pipeboard.trainer.runtime.launch import run_training
    from pipeboard.trainer.tune import search
    from pipeboard.trainer.tune.tuned import run_fields

    print(f"processor: {cpu_name()}", flush=True)
    model_args = {"depth": 8, "width": 1024} if args.model == "mlp" else {}
    size = args.batch_size // args.microbatches
    prof = _profile_spec(args.model, [size], args.batch_size, args.workers, model_args, None, "fp32", "cpu", True,
                         str(ROOT / "test-artifacts" / "machine"), 86400)[0]
    schedules = args.schedules.split(",")
    result = search([prof], workers=args.workers, batch_size=args.batch_size, microbatches=[args.microbatches],
                    schedules=schedules)
    run = {"model": args.model, "model_args": model_args, "data": None, "precision": "fp32"}
    errors = []
    print("candidate | stage | tuner MB | runtime's own MB | measured MB | tuner error")
    for cand in result.candidates:
        if any(cand.recompute):
            continue
        summary = run_training(RunConfig(**run_fields(cand, run), steps=args.steps, eval_at_end=False))
        for entry in summary["memory"]:
            k = entry["stage"]
            tuner = cand.stage_memory_bytes[k] if k < len(cand.stage_memory_bytes) else None
            measured = entry.get("measured_bytes")
            err = (tuner - measured) / measured if tuner and measured else None
            if err is not None:
                errors.append(err)
            print(f"{cand.label()} | {k} | {tuner / 1e6 if tuner else float('nan'):.1f} | "
                  f"{(entry.get('predicted_bytes') or 0) / 1e6:.1f} | {(measured or 0) / 1e6:.1f} | "
                  f"{'' if err is None else f'{100 * err:+.1f}%'}", flush=True)
    if errors:
        errors.sort(key=abs)
        print(f"{len(errors)} stages: median |error| {100 * abs(errors[len(errors) // 2]):.1f}%, "
              f"worst {100 * max(errors, key=abs):+.1f}%")


if __name__ == "__main__":
    main()
