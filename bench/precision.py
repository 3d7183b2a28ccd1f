"""fp32 against bf16 mixed precision (``--precision bf16``): loss, speed and memory, one bench run.

    .venv/bin/python bench/precision.py [--rounds 2] [--steps 60] [--schedule 1f1b] [--stages 2]

Two tasks, each trained by ``run_training`` in both precisions with the same model, seed,
schedule, batch and steps, the precisions alternating round by round (fp32 first, then bf16
first):

- the zoo's ``mlp`` (depth 4, width 512): the runtime's benchmark model, Linear layers only;
- the zoo's ``gpt2-text`` (4 layers, width 128, 4 heads, 64 tokens): a transformers GPT-2 on
  the bytes of Python's standard-library sources.

Printed per task and precision: the training loss over the last five steps (the goal: bf16
within 2% of fp32 after the same steps), steady-state samples/s, and each stage's peak
resident memory (the workers' reports, max over the run); then bf16 / fp32 of each. bf16 here
is autocast on the CPU: whether it is faster depends on the processor's bf16 support (AVX-512
BF16, AMX), which this prints from /proc/cpuinfo.
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

from trainer.allocator import prefer_huge_pages  # noqa: E402

prefer_huge_pages()  # as `pipeboard train` runs (before torch allocates)

import torch  # noqa: E402

from trainer.runtime import RunConfig, run_training  # noqa: E402
from trainer.sink import ListSink  # noqa: E402

TASKS = {
    "mlp": {"depth": 4, "width": 512, "samples": 4096},
    "gpt2-text": {"layers": 4, "dim": 128, "heads": 4, "seq_len": 64},
}
BATCH = {"mlp": 64, "gpt2-text": 16}


def cpu_name() -> str:
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    bf16 = [f for f in ("avx512_bf16", "amx_bf16", "avx512f") if f in flags]
    return (f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, model "
            f"{fields.get('model', '?')}; bf16-related flags: {', '.join(bf16) or 'none'})")


def one_run(name: str, precision: str, args) -> dict:
    sink = ListSink()
    cfg = RunConfig(model=name, model_args=TASKS[name], schedule=args.schedule, num_stages=args.stages,
                    batch_size=BATCH[name], microbatches=args.microbatches, steps=args.steps, seed=args.seed,
                    precision=precision, eval_at_end=False)
    summary = run_training(cfg, sink)
    records = sorted(sink.metrics, key=lambda r: r.step)
    losses = [r.values["loss"] for r in records if "loss" in r.values]
    memory = {}
    for r in records:
        for key, value in r.values.items():
            if key.startswith("memory_bytes."):
                memory[key] = max(memory.get(key, 0.0), value)
    return {"loss": sum(losses[-5:]) / len(losses[-5:]), "samples_per_s": summary["samples_per_s"],
            "memory": [memory[k] for k in sorted(memory)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    args = ap.parse_args()
    print(f"precision benchmark: {cpu_name()}, {len(os.sched_getaffinity(0))} usable CPUs, torch {torch.__version__}")
    print(f"  schedule {args.schedule}, {args.stages} stages, {args.microbatches} microbatches, {args.steps} steps, "
          f"{args.rounds} alternating rounds")
    results: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.rounds):
        order = ("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")
        for name in args.tasks:
            for precision in order:
                results.setdefault((name, precision), []).append(one_run(name, precision, args))
        print(f"  round {r + 1}/{args.rounds} done", flush=True)
    print(f"\n{'task':10s} {'precision':9s} {'loss (last 5)':>13s} {'samples/s':>10s}  peak memory per stage (MB)")
    for name in args.tasks:
        med = {}
        for precision in ("fp32", "bf16"):
            runs = results[(name, precision)]
            loss = statistics.median(x["loss"] for x in runs)
            sps = statistics.median(x["samples_per_s"] for x in runs)
            mem = [max(x["memory"][i] for x in runs) / 1e6 for i in range(len(runs[0]["memory"]))]
            med[precision] = (loss, sps, mem)
            print(f"{name:10s} {precision:9s} {loss:13.5f} {sps:10.1f}  " + ", ".join(f"{m:.0f}" for m in mem))
        (l32, s32, m32), (l16, s16, m16) = med["fp32"], med["bf16"]
        print(f"{name:10s} bf16/fp32  loss {l16 / l32 - 1:+.2%} (goal: within 2%), samples/s {s16 / s32:.2f}x, "
              f"memory " + ", ".join(f"{b / a:.2f}x" for a, b in zip(m32, m16)))


if __name__ == "__main__":
    main()
