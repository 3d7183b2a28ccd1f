"""The prediction's error per step length band: a text task padded per batch, profiled at its
data's lengths, each step predicted from its own padded length and measured in the runtime.

The task (trainer/zoo/varlen_text.py): a transformers GPT-2 causal LM, per-sample lengths from
``--lo`` to ``--hi`` (``--uniform``: uniform; default mostly short, ``lo + (hi - lo) * u**3``, so
that every third of the range has batches), padded per batch, on ``--stages`` stages under
``--schedule`` with immediate weight gradients. Steps:

1. the run's batches in its own order (epoch 0, ``Task.train_batches``) give each step's padded
   length; the model is profiled at ``--points`` of those lengths (``profile_at_lengths``: one
   torch thread as each worker has, under the load of ``stages - 1`` processes training it), with
   the runtime's per-action overhead, the data loading and the link measured as a job's profile
   does;
2. the stages split the layers' expected time over the data's lengths evenly (contiguous);
3. each step's prediction is ``predict_step_s(..., length=L)`` at its padded length L;
4. the runtime trains ``--steps`` steps on those stages; each step's time is the gap between
   its completion and the previous one's (the first ``--skip`` steps are warm-up).

Prints per band (short, middle, long thirds of lo..hi) the steps, the median measured and
predicted step and the median |predicted - measured| / measured, then overall, with the processor;
then the same on the second half of the steps with the predictions times one factor, the median
measured / predicted over the first half: on a shared machine the workers get part of a core,
which stretches every step alike and which the profile's CPU-time clock does not see, so the
second table shows how well the prediction follows the length apart from that factor.

    nice -n 19 .venv/bin/python bench/length_bands.py [--steps 600] [--layers 4] [--dim 128]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the repository instead of bench/ (whose profile.py would shadow the standard library's for transformers)
sys.path[0] = str(ROOT)

import torch  # noqa: E402

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402
from pipeboard.trainer.profile.at_lengths import padded_lengths, profile_at_lengths  # noqa: E402
from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.runtime.links import measure_link  # noqa: E402
from pipeboard.trainer.runtime.overhead import calibrate, measure_data_load  # noqa: E402
from pipeboard.trainer.schedule.predict import predict_step_s, profile_overhead  # noqa: E402
from pipeboard.trainer.sink import ListSink  # noqa: E402
from pipeboard.trainer.zoo.varlen_text import causal_lm  # noqa: E402


def split(profile, stages: int) -> list[list[str]]:
    """Contiguous stages of about equal expected compute (inputs excluded, as the runtime's split)."""
    inputs = set(profile.meta.get("inputs") or [])
    layers = [layer for layer in profile.layers if layer.name not in inputs]
    total = sum(layer.compute_ms for layer in layers)
    out: list[list[str]] = [[]]
    done = 0.0
    for k, layer in enumerate(layers):
        left = len(layers) - k  # every stage keeps at least one layer
        if out[-1] and len(out) < stages and (done >= total * len(out) / stages or left <= stages - len(out)):
            out.append([])
        out[-1].append(layer.name)
        done += layer.compute_ms
    return out


def band_of(length: int, lo: int, hi: int) -> str:
    third = (hi - lo) / 3
    return "short" if length < lo + third else "middle" if length < lo + 2 * third else "long"


def row(name: str, rows: list[tuple[int, float, float]]) -> str:
    if not rows:
        return f"{name:>7}: no steps"
    err = [abs(p - m) / m for _, m, p in rows]
    return (f"{name:>7}: {len(rows):3d} steps, lengths {min(r[0] for r in rows)}..{max(r[0] for r in rows)}, "
            f"measured median {statistics.median(r[1] for r in rows) * 1e3:7.1f} ms, predicted median "
            f"{statistics.median(r[2] for r in rows) * 1e3:7.1f} ms, median |error| {statistics.median(err):.1%} "
            f"(spread {min(err):.1%}..{max(err):.1%})")


def report(steps: list[tuple[int, int, float, float]], lo: int, hi: int, factor: float, flat: float) -> None:
    """Per band: the prediction at each step's length, and beside it the median |error| of one
    prediction for every step (the expected step over the data's lengths: what a profile at one
    length, or a planner's expectation, would say)."""
    bands: dict[str, list[tuple[int, float, float]]] = {"short": [], "middle": [], "long": []}
    for _, n, measured, predicted in steps:
        bands[band_of(n, lo, hi)].append((n, measured, predicted * factor))
    bands["overall"] = [r for rows in list(bands.values()) for r in rows]
    for name, rows in bands.items():
        blind = statistics.median(abs(flat * factor - m) / m for _, m, _ in rows) if rows else float("nan")
        print(f"{row(name, rows)}; one prediction for all steps: {blind:.1%}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lo", type=int, default=16)
    ap.add_argument("--hi", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the comparison")
    ap.add_argument("--points", type=int, default=4, help="lengths the profiler measures")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--timer", default="auto", choices=["auto", "wall", "cpu"],
                    help="the profiler's clock (auto: CPU time of its one thread)")
    ap.add_argument("--uniform", action="store_true", help="lengths uniform (default: mostly short, u**3)")
    args = ap.parse_args()
    started = time.perf_counter()
    model_args = {"lo": args.lo, "hi": args.hi, "samples": args.batch_size * args.steps, "layers": args.layers,
                  "dim": args.dim, "skew": not args.uniform, "batch_size": args.batch_size}
    print(f"processor: {cpu_name()}; torch {torch.__version__}; GPT-2 causal LM {args.layers} layers width {args.dim}, "
          f"lengths {args.lo}..{args.hi} {'uniform' if args.uniform else 'mostly short'} padded per batch, "
          f"{args.stages} stages {args.schedule}, batch {args.batch_size} x {args.microbatches} microbatches, "
          f"{args.steps} steps, fp32", flush=True)
    task = causal_lm(**model_args)
    mb = args.batch_size // args.microbatches
    batches = [x for x, _ in itertools.islice(task.train_batches(args.batch_size, 0), args.steps)]
    lengths = padded_lengths(batches, 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker runs
    try:
        prof = profile_at_lengths(task.model, batches, 1, mb, points=args.points, warmup=2, repeats=args.repeats,
                                  optimizer="sgd", concurrent=args.stages - 1, split_backward=False,
                                  timer=args.timer)
    finally:
        torch.set_num_threads(threads)
    prof.overhead = calibrate()
    prof.overhead.load_first_ms, prof.overhead.load_last_ms = (
        s * 1e3 for s in measure_data_load(task, args.batch_size, args.microbatches))
    prof.link = measure_link()
    got = prof.lengths
    print(f"profiled at lengths {got.measured} ({prof.meta['lengths_wall_s']:.0f} s); per-batch lengths "
          f"histogram edges {[round(e) for e in got.edges]} counts {got.counts}", flush=True)
    stages = split(prof, args.stages)
    overhead = profile_overhead(prof, stages)
    predicted = {n: predict_step_s(prof, stages, args.schedule, args.microbatches, overhead=overhead, length=n)
                 for n in sorted(set(lengths))}
    flat = predict_step_s(prof, stages, args.schedule, args.microbatches, overhead=overhead)
    print(f"stages: {[len(s) for s in stages]} layers; expected step over the data {flat * 1e3:.1f} ms", flush=True)

    sink = ListSink()
    cfg = RunConfig(model="pipeboard.trainer.zoo.varlen_text:causal_lm", model_args=model_args, schedule=args.schedule,
                    stages=stages, batch_size=args.batch_size, microbatches=args.microbatches, steps=args.steps,
                    eval_at_end=False, weight_grads="immediate")
    run_training(cfg, sink)
    done = {r.step - 1: r.wall_s for r in sink.metrics if r.values.get("loss") is not None or "stages" in r.values}
    steps = [(k, lengths[k], done[k] - done[k - 1], predicted[lengths[k]])
             for k in range(max(1, args.skip), args.steps) if k in done and k - 1 in done]
    print("predicted from each step's padded length, against its measured time (all steps after warm-up):")
    report(steps, args.lo, args.hi, 1.0, flat)
    # What a shared machine's time-sharing adds is one factor on every step, which a CPU-time
    # profile cannot see: measured over predicted on the first half, the error on the second.
    half = len(steps) // 2
    factor = statistics.median(m / p for _, _, m, p in steps[:half])
    print(f"with one factor {factor:.2f} (median measured / predicted over the first {half} steps), "
          f"on the other {len(steps) - half}:")
    report(steps[half:], args.lo, args.hi, factor, flat)
    print(f"wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
