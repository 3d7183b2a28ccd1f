"""GPU check: a zoo model trained by our runtime on CUDA against one-process training.

    .venv/bin/python bench/gpu.py [--device cuda|cpu] [--model-arg k=v ...] [--batch-size B]
                                  [--microbatches M] [--steps N] [--workers W]
                                  [--schedules 1f1b,pipedream] [--precisions fp32,bf16]

Prepared for a session that is lent a GPU machine (bench/gpu_smoke.sh runs it there). It prints
the processor and devices, then
- samples/s of one process training the whole model on the full batch (the baseline);
- ``run_training`` with each schedule and precision on ``--workers`` stage processes (4 by
  default): a GPU each where there are enough, else several on one GPU packed by predicted
  memory (trainer/runtime/gpu_share.py), same-GPU ranks exchanging through host memory; its
  samples/s and the ratio to the baseline, and each stage's predicted and measured peak memory;
- the timeline check: the runtime's forward and backward spans of a one-stage run (CUDA events on
  a GPU) against the same model's forward and backward timed by CUDA events in a plain loop, per
  microbatch (medians and their ratio).
``--device cpu`` runs the same script on CPU processes (gloo, host clock), which is how it is
tested where no GPU is.
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

import torch  # noqa: E402

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402
from pipeboard.trainer.precision import autocast  # noqa: E402
from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.runtime.data import TrainStream  # noqa: E402
from pipeboard.trainer.sink import ListSink  # noqa: E402
from pipeboard.trainer.zoo import get as zoo_get  # noqa: E402


class Clock:
    """Elapsed seconds of GPU work (CUDA events) or of the host (CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def between(self, a, b) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        return b - a


def _optimizer(zoo, model, optimizer: str):
    if optimizer == "default":
        return zoo.make_optimizer(model.parameters())
    return torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)


def one_process(model_args: dict, batch_size: int, steps: int, device: torch.device, optimizer: str,
                precision: str) -> float:
    """Samples/s of plain training on one device (steady state: the first tenth of steps skipped)."""
    zoo = zoo_get("mlp", **model_args)
    model = zoo.model.to(device)
    optim = _optimizer(zoo, model, optimizer)
    stream = TrainStream(zoo, batch_size, 1, device)
    clock = Clock(device)
    skip = max(1, steps // 10)
    t0 = None
    for k in range(steps):
        if k == skip:
            t0 = clock.mark()
        x, y = stream.microbatch(k)
        with autocast(device.type, precision):
            loss = zoo.loss(model(x), y)
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
    return batch_size * (steps - skip) / clock.between(t0, clock.mark())


def loop_spans(model_args: dict, microbatch: int, repeats: int, device: torch.device) -> tuple[float, float]:
    """Median forward and backward seconds of the whole model on one microbatch, timed by CUDA
    events around each (host clock on CPU), in a plain loop."""
    zoo = zoo_get("mlp", **model_args)
    model = zoo.model.to(device)
    stream = TrainStream(zoo, microbatch, 1, device)
    clock = Clock(device)
    fwd, bwd = [], []
    for k in range(repeats + 3):
        x, y = stream.microbatch(k)
        a = clock.mark()
        loss = zoo.loss(model(x), y)
        b = clock.mark()
        loss.backward()
        c = clock.mark()
        model.zero_grad(set_to_none=True)
        if k >= 3:  # warm-up: the allocator and the kernels' first launches
            fwd.append(clock.between(a, b))
            bwd.append(clock.between(b, c))
    return statistics.median(fwd), statistics.median(bwd)


def runtime_spans(events, stage: int = 0) -> tuple[float, float]:
    """Median forward and backward seconds of ``stage`` in a run's timeline (its first step left out)."""
    spans = {"F": [], "B": []}
    for e in events:
        if e.stage == stage and e.kind in spans and e.step > 0:
            spans[e.kind].append(e.end - e.start)
    return statistics.median(spans["F"]), statistics.median(spans["B"])


def _gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:.3f} GiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--model-arg", action="append", default=[], metavar="k=v",
                    help="mlp arguments (default depth=8 width=4096 on cuda, width=256 on cpu)")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--workers", type=int, default=4, help="stage processes (several share a GPU where fewer)")
    ap.add_argument("--schedules", default="1f1b,pipedream")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--optimizer", choices=["sgd", "default"], default="sgd")
    args = ap.parse_args()
    model_args = {"depth": 8, "width": 4096 if args.device == "cuda" else 256}
    for kv in args.model_arg:
        k, _, v = kv.partition("=")
        model_args[k] = int(v)
    print(f"processor: {cpu_name()}; torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("bench/gpu.py: --device cuda but CUDA is not available here (use --device cpu to test the script)")
        for i in range(torch.cuda.device_count()):
            print(f"  cuda:{i} {torch.cuda.get_device_name(i)}")
    else:
        torch.set_num_threads(1)
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    print(f"mlp {model_args}, batch {args.batch_size} in {args.microbatches} microbatches, {args.steps} steps, "
          f"optimizer {args.optimizer}, {args.workers} stage processes")
    for precision in args.precisions.split(","):
        base = one_process(model_args, args.batch_size, args.steps, device, args.optimizer, precision)
        print(f"[{precision}] one process on {device}, full batch: {base:10.1f} samples/s")
        for schedule in args.schedules.split(","):
            cfg = RunConfig(model="mlp", model_args=model_args, schedule=schedule, batch_size=args.batch_size,
                            microbatches=args.microbatches, num_stages=args.workers, workers=args.workers,
                            steps=args.steps, eval_at_end=False, device=args.device, precision=precision,
                            optimizer="sgd" if args.optimizer == "sgd" else None,
                            lr=1e-4 if args.optimizer == "sgd" else None)
            try:
                summary = run_training(cfg)
            except Exception as exc:  # report and go on: the other schedules still tell something
                print(f"  ours {schedule:10s}: failed: {type(exc).__name__}: {exc}")
                continue
            sps = summary["samples_per_s"]
            print(f"  ours {schedule:10s}: {sps:10.1f} samples/s = {sps / base:5.2f}x one process")
            for row in summary.get("memory") or []:
                p, m = row.get("predicted_bytes"), row.get("measured_bytes")
                ratio = f"{m / p:5.2f}" if p and m else "  -  "
                print(f"    stage {row['stage']}: predicted {_gib(p)}, measured {_gib(m)} (measured/predicted {ratio})")
    mb = args.batch_size // args.microbatches
    sink = ListSink()
    cfg = RunConfig(model="mlp", model_args=model_args, schedule="gpipe", batch_size=args.batch_size,
                    microbatches=args.microbatches, num_stages=1, workers=1, steps=max(6, args.steps // 4),
                    eval_at_end=False, device=args.device, optimizer="sgd", lr=1e-4,
                    weight_grads="immediate",  # one backward per microbatch (B), as the loop times it
                    threads=1 if device.type == "cpu" else None)  # on CPU, as many threads as the loop
    run_training(cfg, sink)
    rf, rb = runtime_spans(sink.events)
    lf, lb = loop_spans(model_args, mb, 20, device)
    clock = "CUDA events" if device.type == "cuda" else "host clock"
    print(f"timeline ({clock}), microbatch {mb}: runtime forward {rf * 1e3:.3f} ms, backward {rb * 1e3:.3f} ms; "
          f"plain loop forward {lf * 1e3:.3f} ms, backward {lb * 1e3:.3f} ms; runtime/loop forward {rf / lf:.2f}, "
          f"backward {rb / lb:.2f}")


if __name__ == "__main__":
    main()
