"""Memory per stage as a real run reports it: memory_model's prediction beside the measured peak.

Runs the runtime itself (run_training, one process per worker) and reads the run summary's
``memory`` (one entry per stage: ``predicted_bytes``, ``measured_bytes``) and ``memory_source``.
On CPU the measured figure is counted bytes (``counted``: trainer/runtime/memory_count.py), the
peak over the run's steps of each worker's parameters, stashed versions, gradients, optimizer
state, the tensors autograd saved and the microbatches in flight. Error is
(predicted - measured) / measured, per stage (a worker's stages share its figure: the first of
them is listed).

Beside it, the prediction made before any run, from the model's profile (`pipeboard profile` at
the microbatch size): the one `pipeboard plan`, `POST /plans`, the plan page and the new-job card
show (``choose.simulate_plan``'s memory per stage, ``choose.stage_memory``) for the run's own
stages, schedule, recompute and the task's optimizer.

Prints (a) the per-stage table under gpipe, 1f1b and pipedream, recompute off, and (b) median and
worst |error| over every model, schedule and recompute setting, for each prediction.

    nice -n 19 .venv/bin/python bench/memory_run.py [--models mlp,mlp-digits,cnn-digits,transformer-text,gpt2-text]
        [--schedules gpipe,1f1b,pipedream,zb-h1,interleaved-1f1b] [--workers 2] [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# bench/profile.py would shadow the standard library's profile (torch.export imports cProfile)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402
from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.runtime.run_config import ConfigError  # noqa: E402
from pipeboard.trainer.sink import NullSink  # noqa: E402

MODELS = "mlp,mlp-digits,cnn-digits,transformer-text,gpt2-text"
SCHEDULES = "gpipe,1f1b,pipedream,zb-h1,interleaved-1f1b"
TABLE_A = ("gpipe", "1f1b", "pipedream")
MODEL_ARGS = {"mlp": {"depth": 4, "width": 512, "samples": 512}}  # others: their zoo defaults


def run(model: str, schedule: str, workers: int, recompute: bool, args, profile: dict) -> tuple[list[dict], str]:
    """The run's memory entries, each with ``before_bytes``: the profile's prediction for its stage."""
    chunks = 2 if schedule == "interleaved-1f1b" else 1
    cfg = RunConfig(model=model, model_args=MODEL_ARGS.get(model, {}), schedule=schedule, num_stages=workers,
                    chunks=chunks, batch_size=args.batch_size, microbatches=args.microbatches, steps=args.steps,
                    eval_at_end=False, recompute=list(range(workers * chunks)) if recompute else None)
    try:
        s = run_training(cfg, NullSink())
    except ConfigError as exc:  # e.g. pipedream refuses weights tied across workers (gpt2-text)
        print(f"  {model} {schedule}: refused: {exc}")
        return [], "?"
    if s.get("memory_predicted_error"):
        print(f"  {model} {schedule}: not predicted: {s['memory_predicted_error']}")
    before = before_run(cfg, profile, workers * chunks, chunks, recompute)
    for row in s["memory"]:
        row["before_bytes"] = before[row["stage"]] if before and row["stage"] < len(before) else None
    return s["memory"], s["memory_source"]


def profile_of(model: str, microbatch_size: int) -> dict:
    """The model's profile at the microbatch size, as `pipeboard profile` writes it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "profile.json"
        margs = [a for k, v in MODEL_ARGS.get(model, {}).items() for a in ("--model-arg", f"{k}={v}")]
        subprocess.run([str(Path(sys.executable).with_name("pipeboard")), "profile", model, "--batch-size",
                        str(microbatch_size), *margs, "-o", str(out)], check=True, capture_output=True)
        return json.loads(out.read_text())


def before_run(cfg: RunConfig, profile: dict, stages: int, chunks: int, recompute: bool) -> list[int] | None:
    """Per (virtual) stage, the bytes the plan's prediction gives for the run's split: the stages
    the runtime cut (stage_modules.stage_layers), as a given split (trainer.tune.given), simulated
    as `pipeboard plan` simulates a plan."""
    from pipeboard.trainer.choose import simulate_plan, stage_memory
    from pipeboard.trainer.profile.schema import Profile
    from pipeboard.trainer.runtime import stage_modules
    from pipeboard.trainer.tune.given import split_plan

    task = stage_modules.load_task(cfg)
    layers = stage_modules.stage_layers(cfg, task, stages)
    optimizer = task.optimizer if isinstance(task.optimizer, str) else "adam"
    prof = Profile.from_dict(profile)
    where = {name: k for k, names in enumerate(layers) for name in names}
    for name in prof.layer_names():  # the profile's input layers: on the stage of what reads them
        if name not in where:
            readers = [where[b] for a, b in prof.edges if a == name and b in where]
            layers[min(readers, default=0)].insert(0, name)
    plan = split_plan(prof, [{"layers": names, "replicas": 1} for names in layers], stages, 1e10)
    sched, sim = simulate_plan(plan, cfg.schedule, cfg.microbatches, chunks=chunks, profile_data=profile,
                               recompute="all" if recompute else None, optimizer=optimizer,
                               compare_data_parallel=False)
    return stage_memory(sched, sim)


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def summary(label: str, errors: list[float]) -> str:
    if not errors:
        return f"{label}: no runs"
    worst = max(errors, key=abs)
    return (f"{label}: median |error| {100 * statistics.median(abs(e) for e in errors):.1f}%, "
            f"worst {pct(worst)} ({len(errors)} stages)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--schedules", default=SCHEDULES)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--all-rows", action="store_true", help="table (a) with recompute on too")
    args = ap.parse_args()
    print(f"processor: {cpu_name()}; load average {os.getloadavg()[0]:.2f}; {args.workers} workers, "
          f"batch {args.batch_size} in {args.microbatches} microbatches, {args.steps} steps")
    results = []  # (model, schedule, recompute, stage, runtime's prediction, profile's prediction, measured)
    sources = set()
    for model in args.models.split(","):
        profile = profile_of(model, args.batch_size // args.microbatches)
        for schedule in args.schedules.split(","):
            for recompute in (False, True):
                rows, source = run(model, schedule, args.workers, recompute, args, profile)
                if rows:
                    sources.add(source)
                for r in rows:
                    results.append((model, schedule, recompute, r["stage"], r["predicted_bytes"], r["before_bytes"],
                                    r["measured_bytes"]))
    print(f"memory_source: {', '.join(sorted(s or '?' for s in sources))}")

    def err(p, m):
        return (p - m) / m if p and m else None

    print(f"\n(a) per stage, recompute off{' (and on)' if args.all_rows else ''}: the runtime's prediction from its "
          "stage modules, the profile's before the run, the measured")
    print(f"{'model':<17} {'schedule':<10} {'rc':>3} {'stage':>5} {'runtime MiB':>12} {'error':>8} "
          f"{'profile MiB':>12} {'error':>8} {'measured MiB':>13}")
    table_a: dict[int, list[float]] = {4: [], 5: []}
    for row in results:
        model, schedule, recompute, stage, p, b, m = row
        if (recompute and not args.all_rows) or schedule not in TABLE_A:
            continue
        for i in table_a:
            if err(row[i], m) is not None and not recompute:
                table_a[i].append(err(row[i], m))
        print(f"{model:<17} {schedule:<10} {'on' if recompute else 'off':>3} {stage:>5} "
              + " ".join(f"{(x or 0) / 2**20:>12.2f} {pct(err(x, m)) if err(x, m) is not None else '-':>8}" for x in (p, b))
              + f" {(m or 0) / 2**20:>13.2f}")
    for i, label in ((4, "the runtime's"), (5, "the profile's")):
        print(summary(f"(a) {label} prediction, gpipe, 1f1b, pipedream, recompute off", table_a[i]))

    for i, label in ((4, "the runtime's prediction (from its stage modules)"),
                     (5, "the profile's prediction (before the run: plan, plan page, new-job card)")):
        print(f"\n(b) {label}, every schedule, recompute off and on")

        def errors(keep) -> list[float]:
            return [e for e in (err(r[i], r[6]) for r in results if keep(r)) if e is not None]

        for model in args.models.split(","):
            for recompute in (False, True):
                print("  " + summary(f"{model:<17} recompute {'on ' if recompute else 'off'}",
                                     errors(lambda r: r[0] == model and r[2] == recompute)))
        for schedule in args.schedules.split(","):
            print("  " + summary(f"{schedule:<17}", errors(lambda r: r[1] == schedule)))
        for recompute in (False, True):
            print(summary(f"(b) recompute {'on ' if recompute else 'off'}", errors(lambda r: r[2] == recompute)))
        print(summary("(b) overall", errors(lambda r: True)))
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
