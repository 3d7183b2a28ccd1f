"""Predicted against measured time per step, recompute off and on, and the pipeline against data
parallelism, per model.

    .venv/bin/python bench/predict_time.py [--models mlp-digits,cnn-digits,transformer-text,gpt2-text]
        [--schedules gpipe,1f1b,pipedream,zb-h1,interleaved-1f1b] [--workers 2] [--steps 10] [--runs 3]

Per model (bench/predict_jobs.py's job configurations): the job's calibrated profile
(``predict_jobs.profile``), then per schedule the plan a job would run (``planning.make_plan``,
interleaved-1f1b with 2 chunks) and its predicted steady step (``planning.simulate``'s
``steady_step_s``) with recompute ``none`` and ``all`` (its time: trainer.choose.recomputed_costs),
and data parallelism on the same workers (``data_parallel_step_s``), recompute off and on too: each
pipeline row's order is judged against data parallelism with the same recompute, the one its
prediction is set against (the whole model recomputes when every stage does). Where the plan a job
would run is data parallelism's own layout (one stage, a replica per worker: the cost model
predicted no split faster), the row has no pipeline to order against data parallelism and is not
counted; the fastest predicted split into stages (``choose.ranked_candidates``) is measured
beside it as ``SCHEDULE split``, whose order is. Measured: ``pipeboard train
--plan`` (``predict_jobs.train``), its summary's ``step_s``; the runs alternate (every
configuration once, then again, ``--runs`` rounds) and the median counts. It prints each row, the
median and worst |error|, and per model whether the predicted order of each pipeline against data
parallelism is the measured one; the processor and the load average before and after.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))  # predict_jobs, imported by path below

from pipeboard.app.services import planning  # noqa: E402
from pipeboard.trainer import choose  # noqa: E402
from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402

import predict_jobs  # noqa: E402  (bench/ sibling)

sys.path.pop(0)
DEFAULT_MODELS = "mlp-digits,cnn-digits,transformer-text,gpt2-text"
SCHEDULES = "gpipe,1f1b,pipedream,zb-h1,interleaved-1f1b"


def dp_layout(plan_obj, workers: int) -> bool:
    """The plan is data parallelism's layout: one stage, a replica on every worker."""
    stages = plan_obj.to_dict()["stages"]
    return len(stages) == 1 and int(stages[0].get("replicas") or 1) == workers


def best_split(prof: dict, plan_obj, schedule: str, m: int, workers: int, chunks: int):
    """The fastest predicted candidate of several stages for ``schedule`` (``choose.ranked_candidates``),
    None if none: what a pipeline would run where the plan chose data parallelism's layout."""
    ranked = choose.ranked_candidates(prof, planning.levels_of(None, workers), plan_obj, schedule, m,
                                      weight_grads="batched", chunks=chunks)
    return next((cand for _, cand in ranked if not dp_layout(cand, workers)), None)


def configs(prof: dict, name: str, workers: int, schedules: list[str]) -> list[dict]:
    """One row per (schedule, recompute), and data parallelism: its plan, its prediction. Where
    the plan a job would run is data parallelism's layout (no pipeline to set against data
    parallelism), also the fastest predicted split into stages, labelled ``split``."""
    _, batch, m = predict_jobs.MODELS[name]
    rows = []
    for schedule in schedules:
        chunks = 2 if schedule == "interleaved-1f1b" else 1
        try:
            plan_obj = planning.make_plan(prof, planning.levels_of(None, workers), memory_bytes=None,
                                          method="pipedream", schedule=schedule, microbatches=m, chunks=chunks)
        except Exception as exc:  # a schedule that cannot run this model's plans: say so, go on
            print(f"  {schedule}: no plan ({exc})", flush=True)
            continue
        plans = [(schedule, plan_obj)]
        if dp_layout(plan_obj, workers):
            split = best_split(prof, plan_obj, schedule, m, workers, chunks)
            if split is not None:
                plans.append((f"{schedule} split", split))
        for label, plan in plans:
            for recompute in ("none", "all"):
                _, sim = planning.simulate(plan, schedule, m, samples_per_microbatch=max(1, batch // m),
                                           chunks=chunks, weight_grads="batched", profile_data=prof,
                                           recompute=recompute)
                rows.append({"label": label, "schedule": schedule, "recompute": recompute, "chunks": chunks,
                             "plan": plan, "dp_layout": dp_layout(plan, workers), "predicted_s": sim.steady_step_s,
                             "dp_predicted_s": sim.data_parallel_step_s})
        if schedule == schedules[0]:  # data parallelism's own runs, predicted under the same model
            for recompute in ("none", "all"):  # a pipeline recomputing every stage is set against dp recomputing
                _, sim = planning.simulate(plan_obj, "dp", m, weight_grads="batched", profile_data=prof,
                                           recompute=recompute)
                rows.append({"label": "dp", "schedule": "dp", "recompute": recompute, "chunks": 1, "plan": plan_obj,
                             "dp_layout": True, "predicted_s": sim.steady_step_s,
                             "dp_predicted_s": sim.steady_step_s})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--schedules", default=SCHEDULES)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", default=None)
    args = ap.parse_args()
    keep = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="predict_time_"))
    keep.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    print(f"{cpu_name()}; /proc/loadavg {open('/proc/loadavg').read().strip()} at start; {args.workers} workers, "
          f"{args.steps} steps per run, {args.runs} alternating runs; files in {keep}", flush=True)
    errors, orders = [], []
    for name in args.models.split(","):
        prof, took = predict_jobs.profile(name, args.workers, keep / f"{name}.profile.json")
        print(f"{name}: profiled in {took:.1f} s", flush=True)
        rows = configs(prof, name, args.workers, args.schedules.split(","))
        for row in rows:
            row["path"] = keep / f"{name}-{row['label'].replace(' ', '-')}.plan.json"
            row["path"].write_text(json.dumps(row["plan"].to_dict()))
            row["measured"] = []
        for _ in range(args.runs):  # alternating: every configuration once per round
            for row in rows:
                try:
                    summary = predict_jobs.train(name, row["schedule"], row["path"], args.steps, row["chunks"], None,
                                                 recompute=row["recompute"])
                except subprocess.CalledProcessError as exc:  # say why, and leave the row out
                    row["failed"] = (exc.stderr or exc.stdout or "").strip().splitlines()[-1:] or ["?"]
                    continue
                row["measured"].append(summary["step_s"])
        for row in [r for r in rows if not r["measured"]]:
            print(f"  {name} {row['label']} recompute {row['recompute']}: failed: {row['failed'][0]}", flush=True)
        rows = [r for r in rows if r["measured"]]
        # each row against data parallelism with the same recompute, as the prediction it is set against
        dp_meas = {r["recompute"]: statistics.median(r["measured"]) for r in rows if r["schedule"] == "dp"}
        agree = []
        for row in rows:
            meas = statistics.median(row["measured"])
            pred = row["predicted_s"]
            err = None if pred is None else pred / meas - 1
            if err is not None:
                errors.append(abs(err))
            order = ""
            dp = dp_meas.get(row["recompute"])
            if dp and row["schedule"] != "dp" and pred and row["dp_predicted_s"]:
                order = f"; vs dp predicted {row['dp_predicted_s'] / pred:.2f}x, measured {dp / meas:.2f}x"
                if row["dp_layout"]:  # the same layout as data parallelism: no order to predict
                    order += " (the plan is dp's layout: not counted)"
                else:
                    agree.append((pred < row["dp_predicted_s"]) == (meas < dp))
            print(f"  {name:16s} {row['label']:22s} recompute {row['recompute']:4s} predicted "
                  + (f"{pred * 1e3:8.2f}" if pred else "    none") + f" ms, measured {meas * 1e3:8.2f} ms ("
                  + ", ".join(f"{m * 1e3:.2f}" for m in row["measured"]) + ")"
                  + (f", error {err:+6.1%}" if err is not None else "") + order, flush=True)
        if agree:
            orders.append((name, sum(agree), len(agree)))
            print(f"  {name}: predicted order pipeline against data parallel matches the measured one in "
                  f"{sum(agree)} of {len(agree)} rows of a pipeline (plans of dp's layout not counted)", flush=True)
    if errors:
        print(f"{len(errors)} rows: median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%}")
    for name, ok, n in orders:
        print(f"{name}: order against data parallel matches in {ok}/{n}")
    print(f"/proc/loadavg {open('/proc/loadavg').read().strip()} at end; {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
