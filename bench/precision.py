"""bf16 mixed precision against fp32: the loss after the same steps, the speed and the memory.

    .venv/bin/python bench/precision.py [--rounds 2] [--steps 100] [--models mlp,gpt2-text]
        [--schedule 1f1b] [--stages 2] [--microbatches 4] [--last 10]

Each model trains with ``run_training`` in ``precision="fp32"`` and ``precision="bf16"`` (autocast
forwards, float32 master weights: trainer/precision.py) with the same seed, schedule, batch and
steps, the two alternating (fp32, bf16, then bf16, fp32, ...) for ``--rounds`` rounds:

- ``mlp``: the zoo's synthetic regression MLP, depth 4, width 512, batch 64 (its own);
- ``gpt2-text``: the zoo's transformers GPT-2 on UTF-8 bytes, 4 layers, dim 128, 4 heads,
  seq_len 64, batch 32 (its own).

Printed per model and precision: the training loss of the last step (the mean over its
microbatches, as the runtime reports it) and the mean over the last ``--last`` steps (one step's
loss is one batch's, noisy), the loss at each quarter of the run, the steady-state samples/s
(the runtime's: steps after the first tenth; median over rounds) and ms per step, and each
worker's peak resident memory (the resident bytes a worker reports with every step, maximum over
the run's steps; median over rounds). Then bf16 against fp32: the relative loss difference (goal:
within 2%), the speed ratio (paired: median of per-round ratios) and the memory ratio.

Resident memory is the whole process's (Linux RSS, read at the end of each step): the Python
interpreter, torch and the pages shared with the launcher it was forked from included, so the
difference between precisions is what to read, not the level. The machine is shared: speeds are
noisy; losses are deterministic for a seed (the script says whether the rounds agreed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

# bench/ holds scripts named like stdlib modules (profile.py): keep it off the import path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeboard.trainer.allocator import prefer_huge_pages  # noqa: E402

prefer_huge_pages()  # as `pipeboard train` runs (before torch allocates)

import torch  # noqa: E402

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402
from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.runtime.run_config import SCHEDULES  # noqa: E402
from pipeboard.trainer.sink import ListSink  # noqa: E402

MODELS = {  # zoo name -> (model args, batch size: the task's own)
    "mlp": ({"depth": 4, "width": 512}, 64),
    "gpt2-text": ({"layers": 4, "dim": 128, "heads": 4, "seq_len": 64}, 32),
}
PRECISIONS = ("fp32", "bf16")
MIB = 2**20


def bf16_flags() -> str:
    """The processor's bf16-related features (/proc/cpuinfo): what CPU bf16 autocast's speed hangs on."""
    try:
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    flags = set(line.partition(":")[2].split())
    return ", ".join(f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags) or "none"


def one_run(args, model: str, precision: str) -> dict:
    """One training run; its summary, per-step losses and per-worker peak resident bytes."""
    model_args, batch = MODELS[model]
    layout = dict(workers=args.stages) if args.schedule == "dp" else dict(num_stages=args.stages)
    sink = ListSink()
    s = run_training(RunConfig(model=model, model_args=model_args, schedule=args.schedule, batch_size=batch,
                               microbatches=args.microbatches, steps=args.steps, seed=args.seed,
                               precision=precision, eval_at_end=False, **layout), sink)
    losses = {m.step: m.values["loss"] for m in sink.metrics if "loss" in m.values}
    peak: dict[str, float] = {}
    for m in sink.metrics:  # memory_bytes.<stage>: the largest of that stage's workers' reports
        for key, value in m.values.items():
            if key.startswith("memory_bytes."):
                peak[key] = max(peak.get(key, 0.0), value)
    return {"samples_per_s": s["samples_per_s"], "final_loss": s["final_loss"], "losses": losses,
            "peak": {int(k.rpartition(".")[2]): v for k, v in peak.items()}, "batch": batch}


def tail_mean(losses: dict[int, float], n: int) -> float:
    steps = sorted(losses)[-n:]
    return sum(losses[k] for k in steps) / len(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of fp32 and bf16 per model")
    ap.add_argument("--steps", type=int, default=100, help="training steps per run")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    ap.add_argument("--stages", type=int, default=2, help="pipeline stages (dp: replicas)")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--last", type=int, default=10, help="steps whose mean loss is compared besides the last one")
    args = ap.parse_args()
    models = args.models.split(",")
    if any(m not in MODELS for m in models):
        ap.error(f"--models: choose from {', '.join(MODELS)}")
    if min(args.rounds, args.steps, args.stages, args.microbatches, args.last) < 1:
        ap.error("--rounds, --steps, --stages, --microbatches and --last must be positive")
    last = min(args.last, args.steps)

    print(f"precision benchmark: {cpu_name()}, {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), "
          f"torch {torch.__version__}, CPU bf16 autocast (bf16-related flags: {bf16_flags()})")
    print(f"  schedule {args.schedule}, {args.stages} {'replicas' if args.schedule == 'dp' else 'stages'}, "
          f"{args.microbatches} microbatches, {args.steps} steps per run, seed {args.seed}")
    jobs = [(m, p) for m in models for p in PRECISIONS]
    res: dict[tuple[str, str], list[dict]] = {j: [] for j in jobs}
    for r in range(args.rounds):
        for m in models:  # within a model, neither precision always goes first
            for p in (PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]):
                res[(m, p)].append(one_run(args, m, p))
        print(f"  round {r + 1}/{args.rounds} done", flush=True)

    quarters = sorted({max(1, args.steps * q // 4) for q in (1, 2, 3, 4)})
    for m in models:
        model_args, batch = MODELS[m]
        print(f"\n{m} ({', '.join(f'{k} {v}' for k, v in model_args.items())}), batch {batch}, "
              f"median of {args.rounds} rounds:")
        print(f"  {'':5s} {'last-step loss':>14s} {f'mean last {last}':>13s} {'samples/s':>10s} {'ms/step':>8s}  "
              f"peak resident MiB per worker (stage 0, 1, ...)   loss at steps {', '.join(map(str, quarters))}")
        summary = {}
        for p in PRECISIONS:
            runs = res[(m, p)]
            first = runs[0]
            sps = statistics.median(x["samples_per_s"] for x in runs)
            stages = sorted(first["peak"])
            peaks = [statistics.median(x["peak"][s] for x in runs) for s in stages]
            summary[p] = dict(final=first["final_loss"], tail=tail_mean(first["losses"], last), sps=sps, peaks=peaks)
            curve = ", ".join(f"{first['losses'][k]:.4f}" for k in quarters if k in first["losses"])
            spread = max(abs(x["final_loss"] - first["final_loss"]) for x in runs)
            print(f"  {p:5s} {first['final_loss']:14.5f} {summary[p]['tail']:13.5f} {sps:10.1f} "
                  f"{batch / sps * 1e3:8.1f}  {', '.join(f'{v / MIB:7.1f}' for v in peaks):45s}   {curve}"
                  f"{'' if spread == 0 else f'   (rounds differ by up to {spread:.2g})'}")
        a, b = summary["fp32"], summary["bf16"]
        speed = statistics.median(y["samples_per_s"] / x["samples_per_s"]
                                  for x, y in zip(res[(m, "fp32")], res[(m, "bf16")]))
        within = lambda d: "within 2%" if abs(d) <= 0.02 else "NOT within 2%"  # noqa: E731
        d_final, d_tail = b["final"] / a["final"] - 1, b["tail"] / a["tail"] - 1
        print(f"  bf16 vs fp32: last-step loss {d_final:+.2%} ({within(d_final)}), mean of the last {last} steps "
              f"{d_tail:+.2%} ({within(d_tail)}); samples/s x{speed:.2f} paired "
              f"(x{b['sps'] / a['sps']:.2f} of medians); peak resident memory "
              + ", ".join(f"{y / x - 1:+.1%} ({(y - x) / MIB:+.1f} MiB)" for x, y in zip(a["peaks"], b["peaks"])))


if __name__ == "__main__":
    main()
