"""Coverage of the torch.export capture: transformers architectures, as they come and inside a
user's module, trained by the real runtime.

    .venv/bin/python bench/capture_coverage.py [--archs gpt2,llama,...] [--steps 30]

For each architecture of ``capture_models.py`` (small random configs, fp32, every dropout 0), as
itself and wrapped (``return self.hf(x).logits``):

- **gradients**: one SGD step (lr 1, so the change is the gradient) of batch 8 in 4 microbatches
  under gpipe and 1f1b, on 2 and 4 stages, against single-process gradient accumulation over the
  same microbatches (``reference.train_sync``); the largest parameter difference (goal < 1e-5);
- **pipedream trains**: ``--steps`` steps on 2 stages (embedding and head untied: pipedream
  refuses a parameter shared across workers) end with finite losses;
- **loss falls**: 1f1b, 2 stages, ``--steps`` steps: the mean of the last 5 losses against the
  first.

It prints the processor, torch and transformers versions, one row per case as it finishes, and
the table at the end.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# bench/profile.py would shadow the standard library's profile (transformers imports cProfile)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))  # the checkout, when run as a script

import torch  # noqa: E402

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402
from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.runtime.checkpoint import assemble_model  # noqa: E402
from pipeboard.trainer.runtime.reference import train_sync  # noqa: E402
from pipeboard.trainer.sink import ListSink  # noqa: E402

FACTORY = f"{HERE / 'capture_models.py'}:make_task"
ARCHS = ("gpt2", "llama", "mistral", "qwen2", "gemma", "phi3", "mixtral", "bert", "roberta", "t5", "bart", "vit",
         "convnext", "resnet")


def max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return max(float((pa[k] - pb[k]).detach().abs().max()) for k in pa)


def grad_diff(arch: str, wrapped: bool, schedule: str, stages: int) -> float:
    """Largest |pipelined - single-process| parameter after one SGD step of lr 1 (= the gradients')."""
    with tempfile.TemporaryDirectory() as ckpt:
        cfg = RunConfig(model=FACTORY, model_args={"arch": arch, "wrapped": wrapped}, schedule=schedule,
                        num_stages=stages, batch_size=8, microbatches=4, steps=1, checkpoint_dir=ckpt,
                        eval_at_end=False, optimizer="sgd", lr=1.0)
        run_training(cfg)
        trained, _ = assemble_model(cfg, Path(ckpt))
    before, after = train_sync(cfg, 0), train_sync(cfg, 1)
    if max_diff(before, after) < 1e-4:
        raise RuntimeError("the reference step did not move the weights")
    return max_diff(trained, after)


def losses(arch: str, wrapped: bool, schedule: str, steps: int) -> list[float]:
    sink = ListSink()
    cfg = RunConfig(model=FACTORY, model_args={"arch": arch, "wrapped": wrapped, "tied": schedule != "pipedream"},
                    schedule=schedule, num_stages=2, batch_size=8, microbatches=4, steps=steps, eval_at_end=False,
                    optimizer="adam", lr=3e-3)
    run_training(cfg, sink)
    return [r.values["loss"] for r in sorted(sink.metrics, key=lambda r: r.step) if "loss" in r.values]


def case(arch: str, wrapped: bool, steps: int) -> dict:
    row: dict = {"arch": arch, "wrapped": wrapped}
    started = time.perf_counter()
    try:
        row["diffs"] = {(s, k): grad_diff(arch, wrapped, s, k) for s in ("gpipe", "1f1b") for k in (2, 4)}
        pd = losses(arch, wrapped, "pipedream", steps)
        row["pipedream"] = len(pd) == steps and all(math.isfinite(v) for v in pd)
        fb = losses(arch, wrapped, "1f1b", steps)
        row["loss"] = (fb[0], sum(fb[-5:]) / 5)
    except Exception as exc:  # a failing case is a row of the table, not the end of the bench
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    row["seconds"] = time.perf_counter() - started
    return row


def line(row: dict) -> str:
    name = f"{row['arch']}{' (wrapped)' if row['wrapped'] else ''}"
    if "error" in row:
        return f"| {name} | failed: {row['error']} | | | | | |"
    d = row["diffs"]
    first, last = row["loss"]
    return (f"| {name} | {d[('gpipe', 2)]:.1e} | {d[('gpipe', 4)]:.1e} | {d[('1f1b', 2)]:.1e} | {d[('1f1b', 4)]:.1e} "
            f"| {'yes' if row['pipedream'] else 'NO'} | {first:.2f} -> {last:.2f}{'' if last < first else ' (NOT falling)'} "
            f"| {row['seconds']:.0f} s |")


def main() -> None:
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default=",".join(ARCHS))
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    archs = [a for a in args.archs.split(",") if a]
    print(f"capture coverage: {cpu_name()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"transformers {transformers.__version__}; fp32, dropout 0, batch 8 in 4 microbatches", flush=True)
    header = ("| model | gpipe 2 | gpipe 4 | 1f1b 2 | 1f1b 4 | pipedream trains | loss first -> last 5 | time |\n"
              "|---|---|---|---|---|---|---|---|")
    print(header, flush=True)
    rows = []
    for arch in archs:
        for wrapped in (False, True):
            rows.append(case(arch, wrapped, args.steps))
            print(line(rows[-1]), flush=True)
    ok = [r for r in rows if "error" not in r]
    worst = max((v for r in ok for v in r["diffs"].values()), default=float("nan"))
    print(f"\n{len(ok)} of {len(rows)} cases ran; largest gradient difference {worst:.2e} (goal < 1e-5); "
          f"pipedream trained in {sum(r['pipedream'] for r in ok)}; loss fell in "
          f"{sum(r['loss'][1] < r['loss'][0] for r in ok)}")
    print(header)
    for row in rows:
        print(line(row))


if __name__ == "__main__":
    main()
