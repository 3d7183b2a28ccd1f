"""The tuner against a measured grid, and the tuner's own speed.

    .venv/bin/python bench/tuner.py [--models mlp,gpt2-text] [--data PATH] [--workers 2] [--batch-size 32]
        [--microbatches 2,4,8,16] [--schedules all|1f1b,gpipe,...] [--repeats 3] [--steps 8] [--no-cap]
        [--speed-only | --no-speed] [--one-cell]

Grid (per model): every applicable schedule x the microbatch counts x the planner's (pipedream)
and the uniform split x recompute off/on everywhere; each cell the median of --repeats runs of
--steps steps by the real runtime, the repeats alternating over the cells (a slow spell of the
machine falls on all of them). The tuner's choice is measured the same way in the same loop
(it is a cell, or one more). Reported: the choice's measured step against the grid's best cell,
as a ratio, and whether it is within 5% or within that cell's own spread (max - min of its
repeats). Then with a cap that rules out the fastest unconstrained candidate (its predicted
memory less one byte): the capped choice against the best measured cell predicted to fit.
The capped choice's measured memory (the run summary's fullest stage: on a CPU the bytes the
runtime counts, trainer/runtime/memory_count.py; on a GPU the allocator's peak) is compared with
the cap.

Speed: `pipeboard tune` without --verify, whole process, on profiles of a 48-layer model (the
synthetic mlp, depth 23) at four microbatch sizes, 8 workers, every schedule, microbatch counts
2, 4, 8, 16, recompute off/on: wall and CPU seconds of the process, median of 3.

Models: mlp (8 x 1,024, the zoo's synthetic regression); the transformers causal LMs gpt2-text and
llama-text and the encoder bert-text (BERT, masked LM), small configs (4 layers, width 64, 64 byte
positions), on --data (a local text file) or, without it, the standard-library sources the zoo ships.

--one-cell: per model, how many cells the grid has and what one run of one cell costs: the run's
whole wall time (process start-up, model build, the steps) against its measured steps, for an
estimate of the whole grid's time (cells x repeats x that).
Prints the processor (lscpu model name) first.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402

MODEL_ARGS = {"mlp": {"depth": 8, "width": 1024}, "gpt2-text": {}, "llama-text": {}, "bert-text": {}}


def profiles_for(model: str, args: dict, sizes: list[int], data: str | None, workers: int, batch_size: int) -> list:
    """The model's profiles at each microbatch size, calibrated as `pipeboard tune SPEC` (and a
    job's profiling phase) calibrates them: link, overhead, concurrent workers, pilot runs."""
    from pipeboard.app.cli.tune import _profile_spec

    return _profile_spec(model, sizes, batch_size, workers, args, data, "fp32", "cpu", True,
                         str(ROOT / "test-artifacts" / "machine"), 86400)


def grid_cells(result) -> list:
    """The grid among the tuner's candidates: pipedream or uniform split, recompute all off or all on."""
    return [c for c in result.candidates
            if c.plan["method"] in ("pipedream", "uniform", "dp") and (all(c.recompute) or not any(c.recompute))]


def measure_cells(cells, run, repeats: int, steps: int) -> None:
    from pipeboard.trainer.tune.verify import measure

    times = {id(c): [] for c in cells}
    held = {id(c): [] for c in cells}
    for r in range(repeats):
        for i, c in enumerate(cells):
            print(f"  repeat {r + 1}/{repeats} cell {i + 1}/{len(cells)}: {c.label()}", file=sys.stderr, flush=True)
            try:
                step, peak = measure(c, run, steps=steps)
            except Exception as exc:  # a cell the runtime refuses: reported, not measured
                print(f"    failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            times[id(c)].append(step)
            if peak:
                held[id(c)].append(peak)
    for c in cells:
        t = times[id(c)]
        c.measured_step_s = statistics.median(t) if t else None
        c.measured_spread_s = (max(t) - min(t)) if t else None
        c.measured_memory_bytes = max(held[id(c)]) if held[id(c)] else None


def report(name: str, choice, cells) -> None:
    measured = [c for c in cells if c.measured_step_s is not None]
    best = min(measured, key=lambda c: c.measured_step_s / c.batch_size)
    ratio = (choice.measured_step_s / choice.batch_size) / (best.measured_step_s / best.batch_size)
    within_spread = choice.measured_step_s <= best.measured_step_s + (best.measured_spread_s or 0.0)
    print(f"{name}: grid best {best.label()}: {best.measured_step_s * 1e3:.2f} ms/step "
          f"(spread {best.measured_spread_s * 1e3:.2f} ms, predicted {best.predicted_step_s * 1e3:.2f} ms)")
    print(f"{name}: choice    {choice.label()}: {choice.measured_step_s * 1e3:.2f} ms/step "
          f"(predicted {choice.predicted_step_s * 1e3:.2f} ms, predicted memory {choice.predicted_memory_bytes} B, "
          f"measured {choice.measured_memory_bytes} B)")
    print(f"{name}: choice / best per sample = {ratio:.3f} (within 5%: {ratio <= 1.05}; within the best cell's "
          f"spread: {within_spread}); choice is rank {sorted(measured, key=lambda c: c.measured_step_s / c.batch_size).index(choice) + 1} of {len(measured)} measured")


def grid(model: str, args: dict, opts) -> None:
    from pipeboard.trainer.tune import TuneError, search

    counts = [int(m) for m in opts.microbatches.split(",")]
    sizes = sorted({opts.batch_size // m for m in counts if opts.batch_size % m == 0})
    print(f"{model} {args}: profiling at microbatch sizes {sizes}", flush=True)
    profs = profiles_for(model, args, sizes, opts.data, opts.workers, opts.batch_size)
    schedules = None if opts.schedules == "all" else opts.schedules.split(",")
    free = search(profs, workers=opts.workers, batch_size=opts.batch_size, microbatches=counts, schedules=schedules)
    cells = grid_cells(free)
    choice = free.choice
    extra = [] if any(c is choice for c in cells) else [choice]
    run = {"model": model, "model_args": args, "data": opts.data, "precision": "fp32"}
    print(f"{model}: {len(cells)} grid cells (+{len(extra)} for the choice), {opts.repeats} repeats of "
          f"{opts.steps} steps", flush=True)
    if opts.one_cell:  # the first cell the runtime runs (tied weights refuse pipedream's)
        for cell in cells:
            try:
                return one_cell(model, cell, run, opts.steps)
            except Exception as exc:
                print(f"  {cell.label()}: {type(exc).__name__}: {str(exc)[:160]}", file=sys.stderr)
        return
    measure_cells(cells + extra, run, opts.repeats, opts.steps)
    report(model, choice, cells + extra)
    if opts.no_cap:
        return
    fastest = choice
    cap = fastest.predicted_memory_bytes - 1
    try:
        capped = search(profs, workers=opts.workers, batch_size=opts.batch_size, microbatches=counts,
                        schedules=schedules, memory_bytes=cap)
    except TuneError as exc:
        print(f"{model}: cap {cap} B: {exc}")
        return
    fitting = [c for c in cells + extra if c.predicted_memory_bytes <= cap and c.measured_step_s is not None]
    pick = next((c for c in fitting if c.key == capped.choice.key), None)
    if pick is None:  # the capped choice is no grid cell (recompute on some stages only): measure it too
        pick = capped.choice
        measure_cells([pick], run, opts.repeats, opts.steps)
        fitting.append(pick)
    print(f"{model}: cap {cap} B per worker (rules out {fastest.label()}):")
    report(f"{model} capped", pick, fitting)
    held = pick.measured_memory_bytes
    # the runtime's measured memory per stage: on a GPU the allocator's peak, on a CPU the bytes it
    # counts (trainer/runtime/memory_count.py), the fullest stage's
    print(f"{model} capped: the choice's measured peak per stage {held} B against the cap {cap} B: "
          f"{'fits' if held is not None and held <= cap else 'does NOT fit'}")


def one_cell(model: str, cell, run, steps: int) -> None:
    """One run of one cell, timed whole: what each of the grid's runs costs, and how much of it
    is not the steps (process start-up, model build and split, the first step)."""
    from pipeboard.trainer.tune.verify import measure

    t0 = time.perf_counter()
    step_s, _ = measure(cell, run, steps=steps)
    whole = time.perf_counter() - t0
    start = time.perf_counter()  # the fixed part alone: the same cell for one step
    measure(cell, run, steps=2)
    fixed = time.perf_counter() - start - 2 * step_s
    print(f"{model}: one run of {cell.label()}: {whole:.2f} s wall for {steps} steps of {step_s * 1e3:.2f} ms "
          f"(steps {steps * step_s:.2f} s; the rest {whole - steps * step_s:.2f} s); a 2-step run of it: "
          f"{fixed + 2 * step_s:.2f} s, of which {fixed:.2f} s is not its steps", flush=True)


def speed(opts) -> None:
    """`pipeboard tune` over a 48-layer model's profiles on 8 workers, whole process."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for size in (4, 8, 16, 32):  # batch 64 in 16, 8, 4, 2 microbatches
            path = Path(tmp) / f"p{size}.json"
            subprocess.run([sys.executable, "-c",
                            "from pipeboard.app.cli import main; main()", "profile", "mlp", "--batch-size", str(size),
                            "--model-arg", "depth=23", "--model-arg", "width=256", "--repeats", "3", "-o", str(path)],
                           check=True, capture_output=True, cwd=ROOT)
            paths.append(str(path))
        layers = len(json.loads(Path(paths[0]).read_text())["layers"])
        command = [sys.executable, "-c", "from pipeboard.app.cli import main; main()", "tune", *paths, "--workers", "8",
                   "--batch-size", "64", "--microbatches", "2,4,8,16", "--json"]
        walls, cpus = [], []
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)
            walls.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        doc = json.loads(out.stdout)
        print(f"speed: `pipeboard tune` {layers}-layer profiles x 4 microbatch sizes, 8 workers, every schedule, "
              f"recompute off/on: {len(doc['candidates'])} candidates ({len(doc['skipped'])} combinations skipped); "
              f"whole process median {statistics.median(walls):.2f} s wall, {statistics.median(cpus):.2f} s CPU "
              f"(runs {', '.join(f'{w:.2f}' for w in walls)} s; load average {os.getloadavg()[0]:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp")
    parser.add_argument("--data", default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--microbatches", default="2,4,8,16")
    parser.add_argument("--schedules", default="all")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--no-cap", action="store_true")
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--one-cell", action="store_true")
    opts = parser.parse_args()
    print(f"processor: {cpu_name()}; cores {os.cpu_count()}", flush=True)
    if not opts.speed_only:
        for model in opts.models.split(","):
            grid(model, MODEL_ARGS.get(model, {}), opts)
    if not opts.no_speed:
        speed(opts)


if __name__ == "__main__":
    main()
