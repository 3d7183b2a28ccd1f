"""A job's predicted time per step against `pipeboard train` with the same plan, without the service.

    .venv/bin/python bench/predict_jobs.py [--models mlp-digits,cnn-digits,...] [--schedules gpipe,1f1b,pipedream]
                                           [--workers 2[,4]] [--steps 30] [--runs 1] [--checkpoints] [--keep DIR]
                                           [--rank SCHEDULE]

For each model (the zoo models, each at its job configuration) and worker count it does
what a train job's runner does, step by step: profiles the model in a child process with the
job's calibration (``python -m pipeboard.app.services.profile_run`` with
``profiles.calibration_args``: the microbatch size, the workers' torch threads, the batched weight
gradients at the whole batch, the link and the runtime's overhead), plans it
(``planning.make_plan`` with the job's schedule: the fastest candidate under the cost model), and for each schedule predicts the steady time per step
(``planning.simulate``'s ``steady_step_s``), then runs ``pipeboard train --plan`` for ``--steps``
steps and reads the summary's ``step_s`` (``pipeboard.trainer.schedule.measured``). It prints one
row per run: predicted, measured, error; then the median and worst |error|, the processor and
the load average (other processes on a shared machine slow runs down: compare rows measured
under similar load). ``--checkpoints`` checkpoints every 20 steps, as a job does. ``--rank
SCHEDULE`` also runs the three candidates the planner ranks first under SCHEDULE
(``planning.ranked_candidates``) and says whether the predicted order is the measured one.
On a loaded machine, docs/runtime.md ("Predicting a run's time per step") says how
its figures were taken.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeboard.app.services import planning, profiles  # noqa: E402

# name -> (model arguments, batch size, microbatches): the zoo matrix (jobs' defaults: batch 32 in 4)
MODELS = {
    "mlp-digits": ({}, 32, 4),
    "cnn-digits": ({}, 32, 4),
    "resnet-digits": ({}, 32, 4),
    "transformer-text": ({}, 32, 4),
    "mlp": ({"depth": 8, "width": 1024}, 64, 8),
    "gpt2-text": ({}, 32, 4),  # transformers' GPT-2 (4 layers of 64) on the bundled text
}
CHECKPOINT_EVERY = 20  # a job's default (app/schemas.py DEFAULT_CHECKPOINT_EVERY)


def processor() -> str:
    info = {}
    try:
        for line in open("/proc/cpuinfo"):
            k, _, v = line.partition(":")
            info.setdefault(k.strip(), v.strip())
    except OSError:
        return "unknown processor"
    return f"{info.get('model name', '?')} family {info.get('cpu family', '?')} model {info.get('model', '?')}"


def profile(name: str, workers: int, out: Path) -> tuple[dict, float]:
    """The job's profile of ``name`` for ``workers`` local workers (what the runner's profile
    phase runs), and the seconds it took."""
    args, batch, m = MODELS[name]
    cmd = [sys.executable, "-m", "pipeboard.app.services.profile_run", "--source", name, "--model-args",
           json.dumps(args), "--batch-size", str(max(1, batch // m)), "--device", "cpu", "--repeats", "5",
           "-o", str(out), *profiles.calibration_args(workers, batch, "batched", microbatches=m)]
    t = time.monotonic()
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text()), time.monotonic() - t


def predict(prof: dict, name: str, workers: int, schedule: str, chunks: int = 1, plan_obj=None):
    """(plan, predicted steady seconds per step, the layout: replicas per stage, '+'-joined) of
    the planner's plan for the job (``make_plan`` with its schedule), or of ``plan_obj``."""
    _, batch, m = MODELS[name]
    if plan_obj is None:
        plan_obj = planning.make_plan(prof, planning.levels_of(None, workers), memory_bytes=None, method="pipedream",
                                      schedule=schedule, microbatches=m, chunks=chunks)
    _, sim = planning.simulate(plan_obj, schedule, m, samples_per_microbatch=max(1, batch // m), chunks=chunks,
                               weight_grads="batched", profile_data=prof)
    return plan_obj, sim.steady_step_s, layout_of(plan_obj)


def layout_of(plan_obj) -> str:
    """'layers x replicas' per stage, e.g. '3x1+3x1'."""
    d = plan_obj.to_dict()
    return "+".join(f"{len(st.get('layers') or [])}x{st.get('replicas') or 1}" for st in d["stages"])


def rank(prof: dict, name: str, workers: int, schedule: str, steps: int, keep: Path, runs: int) -> bool | None:
    """Runs the three fastest candidates the planner ranks (``planning.ranked_candidates``) and
    prints predicted and measured order; whether they agree (None: fewer than two candidates)."""
    _, _, m = MODELS[name]
    levels = planning.levels_of(None, workers)
    planned = planning.make_plan(prof, levels, memory_bytes=None, method="pipedream")
    ranked = planning.ranked_candidates(prof, levels, planned, schedule, m)[:3]
    if len(ranked) < 2:
        print(f"  ranking {name} {schedule}: {len(ranked)} candidate(s)", flush=True)
        return None
    rows = []
    for i, (pred, cand) in enumerate(ranked):
        path = keep / f"{name}-w{workers}-{schedule}-cand{i}.plan.json"
        path.write_text(json.dumps(cand.to_dict()))
        meas = statistics.median(train(name, schedule, path, steps, 1, None)["step_s"] for _ in range(runs))
        rows.append((pred, meas, cand.method, layout_of(cand)))
    agree = [r[2:] for r in sorted(rows)] == [r[2:] for r in sorted(rows, key=lambda r: r[1])]
    print(f"  ranking {name} {schedule}: " + "; ".join(f"{meth} {lay} predicted {p * 1e3:.2f} measured {q * 1e3:.2f} ms"
                                                    for p, q, meth, lay in rows)
          + f": order {'agrees' if agree else 'differs'}", flush=True)
    return agree


def train(name: str, schedule: str, plan_path: Path, steps: int, chunks: int, checkpoints: Path | None,
          recompute: str | None = None, events: Path | None = None) -> dict:
    """The summary of ``pipeboard train`` on the plan (the runner's command, less the job); with
    ``events``, every report is appended there as a JSON line (``--events-jsonl``)."""
    args, batch, m = MODELS[name]
    cmd = [str(Path(sys.executable).with_name("pipeboard")), "train", "--model", name]
    for k, v in args.items():
        cmd += ["--model-arg", f"{k}={v}"]
    cmd += ["--plan", str(plan_path), "--schedule", schedule, "--batch-size", str(batch), "--microbatches", str(m),
            "--weight-grads", "batched", "--steps", str(steps), "--json"]
    if chunks > 1:
        cmd += ["--chunks", str(chunks)]
    if recompute is not None:
        cmd += ["--recompute", recompute]
    if checkpoints is not None:
        cmd += ["--checkpoint-dir", str(checkpoints), "--checkpoint-every", str(CHECKPOINT_EVERY)]
    if events is not None:
        cmd += ["--events-jsonl", str(events)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--schedules", default="gpipe,1f1b,pipedream",
                    help="comma-separated; interleaved-1f1b runs with 2 chunks")
    ap.add_argument("--workers", default="2")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--runs", type=int, default=1, help="runs per row (each printed; the median counts)")
    ap.add_argument("--checkpoints", action="store_true", help=f"checkpoint every {CHECKPOINT_EVERY} steps, as a job")
    ap.add_argument("--keep", default=None, help="folder to keep profiles, plans and results in")
    ap.add_argument("--rank", default=None, help="also run the planner's three best candidates under this schedule "
                                                 "and compare the predicted order with the measured one")
    args = ap.parse_args()
    keep = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="predict_jobs_"))
    keep.mkdir(parents=True, exist_ok=True)
    print(f"{processor()}; load average {os.getloadavg()[0]:.2f} at start; {args.steps} steps per run; "
          f"files in {keep}", flush=True)
    rows, agreements = [], []
    for workers in map(int, args.workers.split(",")):
        for name in args.models.split(","):
            prof, took = profile(name, workers, keep / f"{name}-w{workers}.profile.json")
            o = prof.get("overhead") or {}
            print(f"{name}, {workers} workers: profiled in {took:.1f} s"
                  + (f" (overhead calibration {o.get('wall_s', 0):.1f} s)" if o.get("wall_s") else ""), flush=True)
            if args.rank:
                agreements.append(rank(prof, name, workers, args.rank, args.steps, keep, args.runs))
            for schedule in args.schedules.split(","):
                chunks = 2 if schedule == "interleaved-1f1b" else 1
                try:
                    plan_obj, pred, layout = predict(prof, name, workers, schedule, chunks)
                except Exception as exc:  # a schedule that cannot run this plan: say so, go on
                    print(f"  {schedule:16s} cannot run: {exc}", flush=True)
                    continue
                plan_path = keep / f"{name}-w{workers}-{schedule}.plan.json"
                plan_path.write_text(json.dumps(plan_obj.to_dict()))
                measured = []
                for _ in range(args.runs):
                    ckpt = Path(tempfile.mkdtemp(prefix="ckpt_", dir=keep)) if args.checkpoints else None
                    load = os.getloadavg()[0]
                    s = train(name, schedule, plan_path, args.steps, chunks, ckpt)
                    measured.append((s["step_s"], load))
                meas = statistics.median(m for m, _ in measured)
                err = None if pred is None else pred / meas - 1
                rows.append({"model": name, "workers": workers, "schedule": schedule, "replicas": layout,
                             "predicted_s": pred, "measured_s": meas, "runs": measured, "error": err})
                print(f"  {name:16s} w{workers} {schedule:16s} plan {layout:9s} predicted "
                      + (f"{pred * 1e3:8.2f}" if pred else "    none") + f" ms, measured {meas * 1e3:8.2f} ms "
                      f"({', '.join(f'{m * 1e3:.2f}@{ld:.1f}' for m, ld in measured)})"
                      + (f", error {err:+6.1%}" if err is not None else ""), flush=True)
                (keep / "results.json").write_text(json.dumps(rows, indent=1))
    if agreements:
        print(f"ranking: predicted order agrees with the measured one for {sum(a is True for a in agreements)} of "
              f"{sum(a is not None for a in agreements)} models")
    errs = [abs(r["error"]) for r in rows if r["error"] is not None]
    if errs:
        print(f"{len(errs)} rows: median |error| {statistics.median(errs):.1%}, worst {max(errs):.1%}, "
              f"{sum(e <= 0.10 for e in errs)} within 10%; load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
