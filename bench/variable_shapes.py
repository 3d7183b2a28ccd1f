"""Tokens/s of a text task padded per batch to its own longest sequence against padded to the
maximum, in the pipeline runtime.

The task (trainer/zoo/varlen_text.py): random token sequences of lengths drawn uniformly from
``--lo`` to ``--hi`` per sample, a transformers GPT-2 causal LM (``--model encoder``: BERT
classifying), trained on ``--stages`` stages under ``--schedule``. Padded per batch, the capture's
dynamic sequence dimension serves every length; padded to the maximum, every batch is ``--hi``
long. ``--skew``: most lengths short, as typical text is. Both runs see the same samples, so
tokens/s (real tokens, padding excluded: samples/s times the mean real length) compare the same
work. ``--pairs`` alternating pairs (per batch, then to the maximum) in one run; prints each
pair's ratio, the median and the spread (min..max), and the processor (or GPU).

    .venv/bin/python bench/variable_shapes.py [--pairs 5] [--lo 16] [--hi 512] [--steps 12]
    .venv/bin/python bench/variable_shapes.py --device cuda --precision bf16   # one GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the repository instead of bench/ (whose profile.py would shadow the standard library's for transformers)
sys.path[0] = str(ROOT)

import torch  # noqa: E402

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402
from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.zoo.varlen_text import Lengths  # noqa: E402


def tokens_per_s(args, padding: str) -> float:
    model_args = {"lo": args.lo, "hi": args.hi, "samples": args.batch_size * args.steps, "layers": args.layers,
                  "dim": args.dim, "padding": padding, "skew": args.skew}
    cfg = RunConfig(model=f"pipeboard.trainer.zoo.varlen_text:{args.model}", model_args=model_args, schedule=args.schedule,
                    num_stages=args.stages, batch_size=args.batch_size, microbatches=args.microbatches,
                    steps=args.steps, eval_at_end=False, device=args.device, precision=args.precision)
    summary = run_training(cfg)
    data = Lengths(model_args["samples"], args.lo, args.hi, skew=args.skew)
    mean_len = sum(len(ids) for ids, _ in data) / len(data)
    return summary["samples_per_s"] * mean_len


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="causal_lm", choices=["causal_lm", "encoder"])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--lo", type=int, default=16)
    ap.add_argument("--hi", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skew", action="store_true", help="most lengths short (u**3), as typical text; default uniform")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32")
    args = ap.parse_args()
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else cpu_name()
    print(f"processor: {where}; torch {torch.__version__}; {args.model}, lengths {args.lo}..{args.hi}, "
          f"{args.stages} stages {args.schedule}, batch {args.batch_size} x {args.microbatches} microbatches, "
          f"{args.steps} steps, {args.precision}, lengths {'skewed short' if args.skew else 'uniform'}", flush=True)
    ratios = []
    for k in range(args.pairs):
        per_batch = tokens_per_s(args, "batch")
        to_max = tokens_per_s(args, "max")
        ratios.append(per_batch / to_max)
        print(f"pair {k + 1}: padded per batch {per_batch:.0f} tokens/s, padded to {args.hi} {to_max:.0f} tokens/s, "
              f"ratio {ratios[-1]:.2f}", flush=True)
    print(f"median ratio {statistics.median(ratios):.2f} (spread {min(ratios):.2f}..{max(ratios):.2f}, "
          f"{args.pairs} alternating pairs)")


if __name__ == "__main__":
    main()
