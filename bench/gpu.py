"""GPU check: a zoo model trained by our runtime on CUDA (NCCL) against one-process training.

    .venv/bin/python bench/gpu.py [--device cuda|cpu] [--model-arg k=v ...] [--batch-size B]
                                  [--microbatches M] [--steps N] [--schedules 1f1b,pipedream,dp]

Prepared for a session that is lent a GPU machine (minutes of device time: one invocation, no
edits there). It prints the devices, then samples/s of
- one process on one device training the whole model on the full batch (the baseline), and
- ``run_training`` with each schedule on min(GPUs, 4) worker processes, one GPU each (NCCL),
  stages split by layer count,
and each ratio to the baseline. With one GPU it says so and runs the baseline only: NCCL cannot
put two ranks on one device (the launcher refuses it). ``--device cpu`` runs the same script
on CPU processes (gloo), which is how it is tested where no GPU is.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# bench/ holds scripts named like stdlib modules (profile.py): keep it off the import path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.runtime.data import TrainStream  # noqa: E402
from pipeboard.trainer.zoo import get as zoo_get  # noqa: E402


def one_process(model_args: dict, batch_size: int, steps: int, device: torch.device, optimizer: str) -> float:
    """Samples/s of plain training on one device (steady state: the first tenth of steps skipped)."""
    zoo = zoo_get("mlp", **model_args)
    model = zoo.model.to(device)
    optim = zoo.make_optimizer(model.parameters()) if optimizer == "default" else torch.optim.SGD(
        model.parameters(), lr=1e-4, momentum=0.9)
    stream = TrainStream(zoo, batch_size, 1, device)
    skip = max(1, steps // 10)
    t0 = None
    for k in range(steps):
        if k == skip:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        x, y = stream.microbatch(k)
        zoo.loss(model(x), y).backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return batch_size * (steps - skip) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--model-arg", action="append", default=[], metavar="k=v",
                    help="mlp arguments (default depth=8 width=4096 on cuda, width=256 on cpu)")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--schedules", default="1f1b,pipedream,dp")
    ap.add_argument("--optimizer", choices=["sgd", "default"], default="sgd")
    args = ap.parse_args()
    model_args = {"depth": 8, "width": 4096 if args.device == "cuda" else 256}
    for kv in args.model_arg:
        k, _, v = kv.partition("=")
        model_args[k] = int(v)
    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("bench/gpu.py: --device cuda but CUDA is not available here (use --device cpu to test the script)")
        gpus = torch.cuda.device_count()
        for i in range(gpus):
            print(f"  cuda:{i} {torch.cuda.get_device_name(i)}")
        workers = min(gpus, 4)
    else:
        torch.set_num_threads(1)
        workers = 2
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    print(f"mlp {model_args}, batch {args.batch_size} in {args.microbatches} microbatches, {args.steps} steps, "
          f"optimizer {args.optimizer}")
    base = one_process(model_args, args.batch_size, args.steps, device, args.optimizer)
    print(f"  one process on {device}, full batch: {base:10.1f} samples/s")
    if workers < 2:
        print("  one GPU: pipeline runs need a GPU per worker process (NCCL); only the baseline ran")
        return
    for schedule in args.schedules.split(","):
        cfg = RunConfig(model="mlp", model_args=model_args, schedule=schedule, batch_size=args.batch_size,
                        microbatches=args.microbatches, num_stages=None if schedule == "dp" else workers,
                        workers=workers, steps=args.steps, eval_at_end=False, device=args.device,
                        optimizer="sgd" if args.optimizer == "sgd" else None, lr=1e-4 if args.optimizer == "sgd" else None)
        try:
            sps = run_training(cfg)["samples_per_s"]
        except Exception as exc:  # report and go on: the other schedules still tell something
            print(f"  ours {schedule:10s} on {workers} workers: failed: {type(exc).__name__}: {exc}")
            continue
        print(f"  ours {schedule:10s} on {workers} workers: {sps:10.1f} samples/s = {sps / base:5.2f}x one process")


if __name__ == "__main__":
    main()
