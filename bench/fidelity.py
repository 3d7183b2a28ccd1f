"""Prediction fidelity through the service: predicted against measured time per step, for the zoo.

Starts a fresh `pipeboard up --workers 1` on the embedded default (SQLite database and broker) in
a temporary data folder, submits each job of the matrix through the REST API (the planner's plan,
`stop: {steps: 30}`), follows it to its end over SSE and reads the job's `fidelity` (the service's
figures, docs/api.md "Prediction fidelity"). Prints:

1. the matrix: model x schedule x workers: predicted and measured seconds per step, the error, and
   the error of the prediction corrected after 5 steps; the median and worst |error|;
2. the ranking: per model, the planner's plan and two other distinct candidates (other planner
   methods: uniform, time, params, data parallel), each run 3 times in turn (identical jobs vary
   by up to 1.6x here: part 4); predicted order against the order of their median measured steps;
3. the service's overhead: samples/s of the same plan through the service (as submitted, and with
   no checkpoint during the run) and through `pipeboard train` alone, alternating, with the CPU
   seconds of the service's own processes (up, API, Celery worker) and of each run;
4. repeatability: a few rows of the matrix submitted again and again, identical jobs; per row the
   measured steps' spread and the floor it sets: (max - min) / (max + min), the smallest worst
   |error| that any one prediction could have over those repeats, however exact.

    .venv/bin/python bench/fidelity.py [--models mlp-digits,...] [--schedules 1f1b,...] [--workers 2,4]
        [--steps 30] [--quick] [--skip matrix,ranking,overhead,repeats] [--overhead-pairs 3]
        [--overhead-steps 300] [--repeat-rows mlp-digits:1f1b:2,...] [--repeats 5]
        [--ranking-repeats 3]

Timings on a shared machine are noisy: the processor and the load average are printed.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from service_probe import Served  # noqa: E402  (bench/)

# name -> (zoo model, model args, batch size, microbatches): the matrix of models the fidelity figures cover
MODELS = {
    "mlp-digits": ("mlp-digits", {}, 64, 4),
    "cnn-digits": ("cnn-digits", {}, 64, 4),
    "resnet-digits": ("resnet-digits", {}, 64, 4),
    "transformer-text": ("transformer-text", {}, 32, 4),
    "mlp-8x1024": ("mlp", {"depth": 8, "width": 1024}, 64, 8),
}
SCHEDULES = ["gpipe", "1f1b", "pipedream", "interleaved-1f1b", "zb-h1"]
RANKING_METHODS = ["pipedream", "uniform", "time", "params", "dp"]


def processor() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return (f"{fields.get('Model name', '?').strip()} (family {fields.get('CPU family', '?').strip()}, "
            f"model {fields.get('Model', '?').strip()}), {os.cpu_count()} CPUs")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def job_spec(name: str, schedule: str, workers: int, steps: int, method: str = "pipedream") -> dict[str, Any]:
    model, args, batch, micro = MODELS[name]
    spec: dict[str, Any] = {"name": f"fidelity {name} {schedule} x{workers} {method}", "model": model, "model_args": args,
                            "workers": workers, "method": method, "schedule": schedule, "batch_size": batch,
                            "microbatches": micro, "stop": {"steps": steps}}
    if schedule == "interleaved-1f1b":
        spec["hyperparameters"] = {"chunks": 2}
    return spec


def run_job(dep: Served, spec: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
    """Submit, follow the stream to its end, return the job (with its plan's shape under `shape`)."""
    response = dep.http.post("/jobs", json=spec)
    if response.status_code >= 400:
        return {"status": "refused", "error": response.json().get("detail")}
    job_id = response.json()["id"]
    for _ in dep.events(job_id, timeout=timeout):
        pass
    job = dep.api("GET", f"/jobs/{job_id}")
    if job.get("plan_id"):
        plan = dep.api("GET", f"/plans/{job['plan_id']}")
        stages = plan["plan"]["stages"]
        job["shape"] = "+".join(f"{len(st.get('layers') or [])}L" + (f"x{st['replicas']}" if st.get("replicas", 1) > 1 else "")
                                for st in stages)
        job["stage_layers"] = [tuple(st.get("layers") or []) for st in stages]
        job["stage_replicas"] = [st.get("replicas", 1) for st in stages]
    return job


def cpu_s(pid: int, children: bool = False) -> float:
    """CPU seconds (user + system) of a process, or of the children it has reaped."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    i = 13 if children else 11  # utime, stime are fields 14, 15; cutime, cstime 16, 17 (1-based)
    return (int(fields[i]) + int(fields[i + 1])) / ticks


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def matrix(dep: Served, models: list[str], schedules: list[str], workers: list[int], steps: int) -> None:
    print(f"\n== matrix: {steps} steps, the planner's plan (method pipedream) ==", flush=True)
    print(f"{'model':18} {'schedule':17} {'w':>2} {'plan':14} {'pred ms':>9} {'meas ms':>9} {'error':>8} "
          f"{'corr ms':>9} {'corr err':>8}", flush=True)
    errors, corrected = [], []
    for name in models:
        for w in workers:
            for schedule in schedules:
                job = run_job(dep, job_spec(name, schedule, w, steps))
                f = job.get("fidelity") or {}
                if job.get("status") != "succeeded":
                    why = (job.get("error") or "").strip().splitlines()
                    print(f"{name:18} {schedule:17} {w:>2} {job.get('status')}: {why[-1][:90] if why else ''}", flush=True)
                    continue
                print(f"{name:18} {schedule:17} {w:>2} {job.get('shape', '?')[:14]:14} {ms(f.get('predicted_step_s')):>9} "
                      f"{ms(f.get('measured_step_s')):>9} {pct(f.get('error')):>8} {ms(f.get('corrected_step_s')):>9} "
                      f"{pct(f.get('corrected_error')):>8}", flush=True)
                if f.get("error") is not None:
                    errors.append(abs(f["error"]))
                if f.get("corrected_error") is not None:
                    corrected.append(abs(f["corrected_error"]))
    for what, xs in (("a-priori", errors), ("corrected after 5 steps", corrected)):
        if xs:
            within = sum(x <= 0.10 for x in xs)
            print(f"{what}: median |error| {statistics.median(xs) * 100:.1f}%, worst {max(xs) * 100:.1f}%, "
                  f"{within} of {len(xs)} within 10%", flush=True)


def ranking(dep: Served, models: list[str], workers: int, steps: int, repeats: int) -> None:
    print(f"\n== ranking: per model, the planner's plan and two other distinct candidates, 1f1b, {workers} workers; "
          f"each run {repeats} time(s), in turn, and ordered by its median measured step ==", flush=True)
    for name in models:
        seen, rows = set(), []
        for method in RANKING_METHODS:
            if len(rows) == 3:
                break
            job = run_job(dep, job_spec(name, "1f1b", workers, steps, method))
            if job.get("status") != "succeeded":
                continue
            key = (tuple(job["stage_layers"]), tuple(job["stage_replicas"]))
            if key in seen:  # the same plan as an earlier candidate's
                continue
            seen.add(key)
            f = job["fidelity"]
            rows.append((method, job["shape"], f["predicted_step_s"], [f["measured_step_s"]]))
        for _ in range(repeats - 1):  # in turn, so that a slow stretch of the machine falls on all of them
            for method, _, _, measured in rows:
                job = run_job(dep, job_spec(name, "1f1b", workers, steps, method))
                if job.get("status") == "succeeded" and (job.get("fidelity") or {}).get("measured_step_s"):
                    measured.append(job["fidelity"]["measured_step_s"])
        by_pred = [r[0] for r in sorted(rows, key=lambda r: r[2])]
        by_meas = [r[0] for r in sorted(rows, key=lambda r: statistics.median(r[3]))]
        cells = ", ".join(f"{m} ({shape}) {ms(p)}/{ms(statistics.median(q))} ms [{'-'.join(ms(x) for x in (min(q), max(q)))}]"
                          for m, shape, p, q in rows)
        print(f"{name:18} predicted/measured median [range]: {cells}", flush=True)
        print(f"{'':18} predicted order {' < '.join(by_pred)}; measured {' < '.join(by_meas)}: "
              f"{'AGREE' if by_pred == by_meas else 'DISAGREE'}", flush=True)


def overhead(dep: Served, tmp: Path, pairs: int, steps: int) -> None:
    name, schedule, w = "mlp-8x1024", "1f1b", 2
    print(f"\n== service overhead: {name} {schedule}, {w} workers, {steps} steps; service and `pipeboard train` "
          f"alone, alternating, the same plan ==", flush=True)
    first = run_job(dep, job_spec(name, schedule, w, steps))
    plan = dep.api("GET", f"/plans/{first['plan_id']}")
    plan_path = tmp / "overhead-plan.json"
    plan_path.write_text(json.dumps(plan["plan"]))
    model, args, batch, micro = MODELS[name]
    cmd = [sys.executable, "-c", "from pipeboard.app.cli import main; main()", "train", "--model", model,
           *[x for k, v in args.items() for x in ("--model-arg", f"{k}={v}")], "--plan", str(plan_path),
           "--schedule", schedule, "--batch-size", str(batch), "--microbatches", str(micro), "--steps", str(steps), "--json"]
    runs: dict[str, list[float]] = {"service": [], "service, no checkpoint": [], "alone": []}
    cpu: dict[str, list[float]] = {"service's own processes": [], "job": [], "job, no checkpoint": [], "alone": []}
    procs = dep.processes()
    for i in range(pairs):
        for variant in ("service", "service, no checkpoint"):
            spec = {**job_spec(name, schedule, w, steps), "name": f"overhead {i} {variant.replace(',', '')}"}
            if variant.endswith("no checkpoint"):  # the service's own checkpoints, every 20 steps by default
                spec["checkpoint_every"] = steps + 1
            own0, run0 = sum(cpu_s(p) for p in procs.values()), cpu_s(procs["worker"], children=True)
            job = run_job(dep, spec)
            if job.get("status") != "succeeded":
                raise RuntimeError(f"{variant}: {job.get('status')}: {job.get('error')}")
            if variant == "service":
                cpu["service's own processes"].append(sum(cpu_s(p) for p in procs.values()) - own0)
            cpu["job" + variant[len("service"):]].append(cpu_s(procs["worker"], children=True) - run0)
            runs[variant].append(job["summary"]["samples_per_s"])
        before = os.times()
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env={**os.environ, **dep.env})
        after = os.times()
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        cpu["alone"].append(after.children_user + after.children_system - before.children_user - before.children_system)
        runs["alone"].append(json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"])
        print(f"  round {i + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in runs.items()) + " samples/s; CPU s: "
              + ", ".join(f"{k} {v[-1]:.1f}" for k, v in cpu.items()) + f" (load {load()})", flush=True)
    a = statistics.median(runs["alone"])
    print("median samples/s: " + ", ".join(f"{k} {statistics.median(v):.0f} ({(statistics.median(v) / a - 1) * 100:+.1f}%)"
                                           for k, v in runs.items()), flush=True)
    print("median CPU s: " + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in cpu.items())
          + " (job: the train process tree the worker ran; alone: `pipeboard train`'s)", flush=True)


def repeatability(dep: Served, rows: list[tuple[str, str, int]], repeats: int, steps: int) -> None:
    print(f"\n== repeatability: identical jobs, {repeats} each, {steps} steps; floor: (max - min) / (max + min), the "
          "smallest worst |error| of any one prediction over them ==", flush=True)
    floors, off_median = [], []
    for name, schedule, w in rows:
        measured, predicted, shape = [], None, "?"
        for i in range(repeats):
            job = run_job(dep, {**job_spec(name, schedule, w, steps), "name": f"repeat {i} {name} {schedule} x{w}"})
            f = job.get("fidelity") or {}
            if job.get("status") != "succeeded" or not f.get("measured_step_s"):
                print(f"{name:18} {schedule:17} {w:>2} repeat {i}: {job.get('status')}", flush=True)
                continue
            measured.append(f["measured_step_s"])
            predicted, shape = f.get("predicted_step_s"), job.get("shape", "?")
        if len(measured) < 2:
            continue
        lo, hi = min(measured), max(measured)
        floors.append((hi - lo) / (hi + lo))
        mid = statistics.median(measured)
        off_median += [abs(m / mid - 1) for m in measured]
        print(f"{name:18} {schedule:17} {w:>2} {shape[:14]:14} predicted {ms(predicted)} ms; measured "
              f"{' '.join(ms(m) for m in measured)} ms: median {ms(mid)}, "
              f"max/min {hi / lo:.2f}, floor {floors[-1] * 100:.1f}%", flush=True)
    if floors:
        print(f"floor: median {statistics.median(floors) * 100:.1f}%, worst {max(floors) * 100:.1f}% over "
              f"{len(floors)} rows", flush=True)
        # had each row been predicted at exactly its repeats' median, these would have been its errors
        print(f"repeats off their row's median by more than 10%: {sum(x > 0.10 for x in off_median)} of "
              f"{len(off_median)}; by more than 25%: {sum(x > 0.25 for x in off_median)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="mlp-digits and mlp-8x1024, 1f1b, 2 workers, 1 overhead pair")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: matrix, ranking, overhead, repeats")
    ap.add_argument("--overhead-pairs", type=int, default=3)
    ap.add_argument("--overhead-steps", type=int, default=300)
    ap.add_argument("--repeat-rows", default="mlp-digits:1f1b:2,mlp-digits:1f1b:4,cnn-digits:1f1b:2,mlp-8x1024:1f1b:2",
                    help="model:schedule:workers rows to submit --repeats times each")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ranking-repeats", type=int, default=3, help="runs of each ranking candidate (median measured)")
    a = ap.parse_args()
    models, schedules = a.models.split(","), a.schedules.split(",")
    workers = [int(x) for x in a.workers.split(",")]
    if a.quick:
        models, schedules, workers, a.overhead_pairs = ["mlp-digits", "mlp-8x1024"], ["1f1b"], [2], 1
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        ap.error(f"--models: unknown {unknown} (use {', '.join(MODELS)})")
    skip = set(filter(None, a.skip.split(",")))
    try:
        repeat_rows = [(m, sch, int(w)) for m, sch, w in (row.split(":") for row in a.repeat_rows.split(",") if row)]
    except ValueError:
        ap.error("--repeat-rows: rows are model:schedule:workers, comma-separated")
    unknown = sorted({m for m, _, _ in repeat_rows} - set(MODELS))
    if unknown:
        ap.error(f"--repeat-rows: unknown model(s) {unknown}")
    print(f"processor: {processor()}; load average at start {load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="pipeboard-fidelity-") as tmp_name:
        tmp = Path(tmp_name)
        up = Served(tmp, timeout=180)
        try:
            if "matrix" not in skip:
                matrix(up, models, schedules, workers, a.steps)
            if "ranking" not in skip:
                ranking(up, models, workers[0], a.steps, a.ranking_repeats)
            if "overhead" not in skip:
                overhead(up, tmp, a.overhead_pairs, a.overhead_steps)
            if "repeats" not in skip and not a.quick:
                repeatability(up, repeat_rows, a.repeats, a.steps)
        finally:
            up.stop()
    print(f"load average at the end {load()}", flush=True)


if __name__ == "__main__":
    main()
