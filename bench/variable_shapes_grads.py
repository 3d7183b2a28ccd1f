"""Gradients of a text task padded per batch, pipelined, against one process's gradient
accumulation over the same microbatches: per model and schedule, the largest
difference of any parameter's gradient after one step.

The task (trainer/zoo/varlen_text.py): sequences of lengths drawn from ``--lo`` to ``--hi`` per
sample, padded per batch to the batch's longest; a transformers GPT-2 causal LM and a BERT encoder
(small configs, fp32, dropout 0), 2 stages, SGD at lr 0.1. After one step a parameter moved by
lr x its gradient (plain SGD, the first step), so the pipeline's parameters minus the reference's,
over lr, are the gradients' difference. The reference is ``train_sync`` (the synchronous
schedules) or ``emulate_async`` (pipedream's action lists in one process).

    .venv/bin/python bench/variable_shapes_grads.py [--lo 16] [--hi 512] [--steps 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # the repository, not bench/ (whose profile.py would shadow the standard library's)

import torch  # noqa: E402

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402
from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.runtime.checkpoint import assemble_model  # noqa: E402
from pipeboard.trainer.runtime.reference import emulate_async, train_sync  # noqa: E402
from pipeboard.trainer.schedule import registry  # noqa: E402

SCHEDULES = ("gpipe", "1f1b", "pipedream", "interleaved-1f1b")  # --schedules all: every registered one
LR = 0.1  # varlen_text's SGD


def largest_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return max(float((pa[k] - pb[k]).detach().abs().max()) for k in pa)


def one(model: str, schedule: str, args) -> tuple[float, float]:
    """(largest gradient difference, largest gradient) after ``args.steps`` steps."""
    kw = {"lo": args.lo, "hi": args.hi, "samples": 8 * args.steps, "layers": args.layers, "dim": args.dim}
    with tempfile.TemporaryDirectory() as tmp:
        shape = {"workers": 2} if registry.is_data_parallel(schedule) else {"num_stages": 2}
        cfg = RunConfig(model=f"pipeboard.trainer.zoo.varlen_text:{model}", model_args=kw, schedule=schedule, **shape,
                        batch_size=8, microbatches=4, steps=args.steps, checkpoint_dir=tmp, eval_at_end=False)
        run_training(cfg)
        trained, _ = assemble_model(cfg, tmp)
    reference = emulate_async(cfg, args.steps) if schedule == "pipedream" else train_sync(cfg, args.steps)
    start = train_sync(cfg, 0)
    return largest_difference(trained, reference) / LR, largest_difference(reference, start) / LR


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lo", type=int, default=16)
    ap.add_argument("--hi", type=int, default=512)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--models", default="causal_lm,encoder")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    args = ap.parse_args()
    print(f"processor: {cpu_name()}; torch {torch.__version__}; lengths {args.lo}..{args.hi}, batch 8 in 4 "
          f"microbatches, 2 stages, fp32, {args.steps} step(s)")
    print(f"{'model':10} {'schedule':18} {'max |grad diff|':>16} {'max |grad|':>12}")
    worst = 0.0
    schedules = registry.names() if args.schedules == "all" else args.schedules.split(",")
    for model in args.models.split(","):
        for schedule in schedules:
            diff, size = one(model, schedule, args)
            worst = max(worst, diff)
            print(f"{model:10} {schedule:18} {diff:16.2e} {size:12.2e}", flush=True)
    print(f"largest difference over all: {worst:.2e} (goal < 1e-5)")
    return 0 if worst < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
