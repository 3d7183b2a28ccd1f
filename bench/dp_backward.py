"""Data parallelism's actions, charged against measured: forward, the whole backward (B) of a
microbatch that does not all-reduce, what DistributedDataParallel's all-reduce adds to the one that
does, and the step; each with the charge a whole B had when it took the input-gradient factor.

    .venv/bin/python bench/dp_backward.py [--models mlp-digits,cnn-digits,transformer-text,gpt2-text]
        [--runs 3] [--steps 20]

Per model (bench/predict_jobs.py's job configurations): the job's calibrated profile, the plan a
1f1b job would run, and data parallelism on its 2 workers (``WORKERS``): the cost model's per-action
charges (``trainer.choose.profile_costs`` with schedule ``dp``) and predicted step (``planning.simulate``).
The pilots run batched weight gradients and measure only BI and W; the cost model charges a B as
its input-gradient part times BI's factor plus the rest times W's. "as BI" is the same profile
with the replicated pilot given a ``backward`` factor equal to BI's: the whole B at BI's factor.
Measured: ``pipeboard train --schedule dp --events-jsonl``, ``--runs`` times; each action's median
span over the second half of the steps, and the median step of the runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # predict_jobs, imported by path below

from pipeboard.app.services import planning  # noqa: E402
from pipeboard.trainer.choose import profile_costs  # noqa: E402
from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402

import predict_jobs  # noqa: E402  (bench/ sibling)

sys.path.pop(0)
WORKERS = 2


def charged(prof: dict, plan, m: int) -> tuple[object, float]:
    """(dp's StageCosts, its predicted step in seconds) under ``prof``."""
    costs = profile_costs(plan, "dp", m, prof, 1)[0]
    _, sim = planning.simulate(plan, "dp", m, weight_grads="batched", profile_data=prof)
    return costs, sim.steady_step_s


def measured(name: str, plan_path: Path, steps: int, m: int, events: Path) -> tuple[dict[str, float], float]:
    """One dp run: median spans in ms (F, B without and with the all-reduce, step) and its step_s."""
    events.unlink(missing_ok=True)
    summary = predict_jobs.train(name, "dp", plan_path, steps, 1, None, events=events)
    spans: dict[str, list[float]] = {"F": [], "B": [], "B_sync": [], "step": []}
    for line in events.read_text().splitlines():
        report = json.loads(line)
        for e in report.get("events", []) if report.get("call") == "on_events" else []:
            if e["step"] < steps // 2 or e["kind"] not in ("F", "B", "step"):
                continue
            # dp deals the step's microbatches to the replicas in turn; each one's last all-reduces
            sync = e["kind"] == "B" and e["microbatch"] % m >= m - WORKERS
            spans["B_sync" if sync else e["kind"]].append((e["end"] - e["start"]) * 1e3)
    return {k: statistics.median(v) for k, v in spans.items()}, summary["step_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp-digits,cnn-digits,transformer-text,gpt2-text")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    keep = Path(tempfile.mkdtemp(prefix="dp_backward_"))
    start = time.monotonic()
    print(f"{cpu_name()}; /proc/loadavg {open('/proc/loadavg').read().strip()} at start; {WORKERS} workers, "
          f"{args.steps} steps per run, {args.runs} runs; files in {keep}", flush=True)
    for name in args.models.split(","):
        _, _, m = predict_jobs.MODELS[name]
        prof, _ = predict_jobs.profile(name, WORKERS, keep / f"{name}.profile.json")
        plan = planning.make_plan(prof, planning.levels_of(None, WORKERS), memory_bytes=None, method="pipedream",
                                  schedule="1f1b", microbatches=m)
        plan_path = keep / f"{name}.plan.json"
        plan_path.write_text(json.dumps(plan.to_dict()))
        as_bi = copy.deepcopy(prof)
        replicated = (as_bi.get("pilot") or {}).get("replicated")
        if replicated:  # without a replicated pilot both charges are the profile's own
            replicated["factors"]["backward"] = replicated["factors"].get("backward_input", 1.0)
        (now, now_step), (old, old_step) = charged(prof, plan, m), charged(as_bi, plan, m)
        runs = [measured(name, plan_path, args.steps, m, keep / f"{name}-{r}.jsonl") for r in range(args.runs)]
        med = {k: statistics.median(r[0][k] for r in runs) for k in runs[0][0]}
        step = statistics.median(r[1] for r in runs)
        print(f"  {name}: F charged {now.fwd_s * 1e3:.2f} ms, measured {med['F']:.2f}; "
              f"B charged {now.bwd_s * 1e3:.2f} (as BI {old.bwd_s * 1e3:.2f}), measured {med['B']:.2f} "
              f"({now.bwd_s * 1e3 / med['B']:.2f}x, as BI {old.bwd_s * 1e3 / med['B']:.2f}x); "
              f"all-reduce charged {now.allreduce_s * 1e3:.2f}, adds {med['B_sync'] - med['B']:.2f} to the syncing B; "
              f"step charged {now.step_s * 1e3:.2f}, measured {med['step']:.2f}", flush=True)
        print(f"  {name}: dp step predicted {now_step * 1e3:.2f} ms (as BI {old_step * 1e3:.2f}), measured "
              f"{step * 1e3:.2f} ({', '.join(f'{r[1] * 1e3:.2f}' for r in runs)}): error {now_step / step - 1:+.1%} "
              f"(as BI {old_step / step - 1:+.1%})", flush=True)
    print(f"/proc/loadavg {open('/proc/loadavg').read().strip()} at end; {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
