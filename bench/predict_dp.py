"""Time per step predicted against measured, pipeline (1f1b on 2 stages) against data parallel
(2 replicas), and whether the predicted order of the two matches the measured one, per model.

    .venv/bin/python bench/predict_dp.py [--models mlp-digits,cnn-digits,transformer-text] [--runs 3] [--steps 30]

Predicted: ``pipeboard.trainer.schedule.predict.predict_step_s`` (the engine's one step model)
fed the model's profile at the microbatch size taken with one concurrent process standing in for
the other worker, the measured link between two processes and the runtime's per-action overhead,
each measured once before the runs. Measured: ``run_training``'s steady-state samples/s turned
into seconds per step; the pipeline and data-parallel runs alternate, ``--runs`` of each, and
the median counts (the machine is shared: the load average is printed before and after).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

# bench/ holds scripts named like stdlib modules (profile.py): keep it off the import path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402

from pipeboard.trainer.profile.profiler import profile_model  # noqa: E402
from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.runtime import stage_modules  # noqa: E402
from pipeboard.trainer.runtime.links import measure_link  # noqa: E402
from pipeboard.trainer.runtime.overhead import measure_action_overhead  # noqa: E402
from pipeboard.trainer.schedule.predict import predict_step_s  # noqa: E402
from pipeboard.trainer.sink import NullSink  # noqa: E402

BATCH, MICROBATCHES, WORKERS = 64, 4, 2


def processor() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return " / ".join(line.split(":", 1)[1].strip() for line in out.splitlines()
                      if line.split(":")[0] in ("Model name", "CPU family", "Model"))


def configs(model: str, steps: int) -> dict[str, RunConfig]:
    common = dict(model=model, batch_size=BATCH, microbatches=MICROBATCHES, steps=steps, eval_at_end=False)
    return {"1f1b": RunConfig(schedule="1f1b", num_stages=WORKERS, **common),
            "dp": RunConfig(schedule="dp", workers=WORKERS, **common)}


def predicted(cfg: RunConfig, link) -> float:
    torch.set_num_threads(1)
    task = stage_modules.load_task(cfg)
    mb = cfg.microbatch_size
    example = task.example_input(mb)
    optimizer = cfg.optimizer or (task.optimizer if isinstance(task.optimizer, str) else "adam")
    prof = profile_model(task.model, example, batch_size=mb, optimizer=optimizer, model_name=cfg.model,
                         repeats=10, concurrent=WORKERS - 1, load_input=example)
    prof.link = link
    if cfg.schedule == "dp":
        stages = stage_modules.stage_layers(cfg.with_(num_stages=1), task, 1)
        replicas = [WORKERS]
    else:
        stages = stage_modules.stage_layers(cfg, task, WORKERS)
        replicas = None
    modules = stage_modules.build_stages(task.model, example, stages, task.layers)
    counts = [sum(1 for m in mod.modules() if any(True for _ in m.parameters(recurse=False))) for mod in modules]
    overhead = [measure_action_overhead(n, k == len(counts) - 1) for k, n in enumerate(counts)]
    return predict_step_s(prof, stages, cfg.schedule, cfg.microbatches, replicas=replicas, link=link,
                          overhead=overhead)


def measured(cfg: RunConfig) -> float:
    summary = run_training(cfg, NullSink())
    if not summary["samples_per_s"]:
        raise RuntimeError(f"{cfg.model} {cfg.schedule}: too few steps for a steady-state rate")
    return cfg.batch_size / summary["samples_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp-digits,cnn-digits,transformer-text")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    print(f"processor: {processor()}; load average {os.getloadavg()[0]:.2f}; torch {torch.__version__}", flush=True)
    link = measure_link()
    errors, matches = [], []
    for model in args.models.split(","):
        cfgs = configs(model, args.steps)
        pred = {name: predicted(cfg, link) for name, cfg in cfgs.items()}
        runs: dict[str, list[float]] = {name: [] for name in cfgs}
        for _ in range(args.runs):  # alternating: a slow spell of the machine hits both
            for name, cfg in cfgs.items():
                runs[name].append(measured(cfg))
        meas = {name: statistics.median(v) for name, v in runs.items()}
        for name in cfgs:
            err = (pred[name] - meas[name]) / meas[name]
            errors.append(abs(err))
            print(f"{model:<17} {name:<5} predicted {1e3 * pred[name]:8.2f} ms/step  measured {1e3 * meas[name]:8.2f} "
                  f"(runs {', '.join(f'{1e3 * v:.2f}' for v in runs[name])})  error {100 * err:+6.1f}%", flush=True)
        same = (pred["1f1b"] < pred["dp"]) == (meas["1f1b"] < meas["dp"])
        matches.append(same)
        print(f"{model:<17} faster predicted: {'1f1b' if pred['1f1b'] < pred['dp'] else 'dp'}; measured: "
              f"{'1f1b' if meas['1f1b'] < meas['dp'] else 'dp'}; order {'matches' if same else 'does NOT match'}",
              flush=True)
    print(f"step time |error| median {100 * statistics.median(errors):.1f}%, worst {100 * max(errors):.1f}%; "
          f"order matches for {sum(matches)} of {len(matches)} models; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
