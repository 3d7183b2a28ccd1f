"""Simulator prediction fed the profile vs the runtime's measured step time.

    .venv/bin/python bench/predict.py [--config a|b|both] [--schedules 1f1b,gpipe,pipedream,pipedream:1]
                                      [--weight-grads batched,immediate] [--steps N] [--runs N] [--repeats R]
                                      [--cpu-matmul default|onednn]

The configurations of bench/runtime.py: mlp depth=8 width=1024, 2 stages on 2 processes, one
torch thread each, SGD; (a) batch 64 in 8 microbatches, (b) batch 512 in 8. ``pipedream:1`` is
pipedream on whole batches (one microbatch per update).

It measures, in this order: the link between two processes (pipeboard.trainer.runtime.links), the model's
profile at every microbatch size and batch size the runs need (with one concurrent training
process standing in for the other stage, ``concurrent=1``, training on microbatches as that stage
does), then each run. For every schedule,
configuration and weight-gradient mode it prints the runtime's measured time per step (steady
state, ``run_training``'s samples/s; the fastest of ``--runs`` runs, since other processes on the
shared machine only ever slow a run down), ``predict_step_s``'s prediction and the error, then the
per-action costs the prediction used next to the means the runtime recorded (instrumented run),
so a miss can be traced to the action that causes it. Two overheads are tried: the tiny-stage
one (``pipeboard.trainer.runtime.overhead.measure_action_overhead``: what the runtime's ``Stage`` adds to
each call) and the runtime floor
(``runtime_floor``: the whole runtime's step on the same schedule with the model shrunk to width
4, spread over the critical path's actions). A third figure simulates the same schedule
on the action times the run itself recorded (plus the link's latency): how far the schedule and
transfer model alone is from the measurement when every action's cost is right.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

# bench/ holds scripts named like stdlib modules (profile.py): keep it off the import path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeboard.trainer.allocator import prefer_huge_pages  # noqa: E402

prefer_huge_pages()  # as `pipeboard train` runs, for every process measured here (before torch allocates)

import torch  # noqa: E402

from pipeboard.trainer import cpu_matmul  # noqa: E402
from pipeboard.trainer.runtime.links import measure_link  # noqa: E402
from pipeboard.trainer.profile.profiler import profile_model  # noqa: E402
from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.runtime import stage_modules  # noqa: E402
from pipeboard.trainer.runtime.overhead import measure_action_overhead  # noqa: E402
from pipeboard.trainer.schedule.action_costs import StageCosts  # noqa: E402
from pipeboard.trainer.schedule.predict import ActionOverhead, predict_step_s, stage_costs, steady_step_s  # noqa: E402
from pipeboard.trainer.sink import NullSink  # noqa: E402

CONFIGS = {"a": dict(batch_size=64, microbatches=8), "b": dict(batch_size=512, microbatches=8)}
MODEL_ARGS = {"depth": 8, "width": 1024}
STAGES = 2
OPTIMIZER = os.environ.get("BENCH_OPTIMIZER", "sgd")
LR = 1e-4


def run_cfg(schedule: str, batch_size: int, microbatches: int, steps: int, weight_grads: str) -> RunConfig:
    """bench/runtime.py's run configuration, with the weight-gradient mode."""
    name, _, own = schedule.partition(":")
    return RunConfig(model="mlp", model_args=MODEL_ARGS, schedule=name, batch_size=batch_size,
                     microbatches=int(own) if own else microbatches, num_stages=STAGES, steps=steps,
                     eval_at_end=False, optimizer=OPTIMIZER, lr=LR, weight_grads=weight_grads)


class ActionTimes(NullSink):
    """Mean seconds of each (worker, action kind) over the run's steps after the first tenth."""

    def __init__(self) -> None:
        self.events = []

    def on_events(self, events) -> None:
        self.events.extend(events)

    def means(self) -> dict[tuple[int, str], float]:
        if not self.events:
            return {}
        top = max(e.step for e in self.events)
        skip = max(1, (top + 1) // 10)
        spans = defaultdict(list)
        for e in self.events:
            if skip <= e.step < top:  # the last step may hold a drain
                spans[(e.worker, e.kind)].append(e.end - e.start)
        return {k: statistics.fmean(v) for k, v in spans.items()}


def recorded_costs(actions: dict, M: int, link) -> list[StageCosts]:
    """StageCosts from the runtime's recorded mean action times (posting a send charged to the
    compute before it, as the prediction does), transfers from the measured link's latency."""
    out = []
    for k in range(STAGES):
        a = {kind: v for (w, kind), v in actions.items() if w == k}
        fwd = a.get("F", 0.0) + a.get("send_act", 0.0)
        sg = a.get("send_grad", 0.0)
        bi = a.get("BI", a.get("B", 0.0)) + sg
        w = a.get("W", 0.0) / M if "BI" in a else 0.0
        out.append(StageCosts(fwd_s=fwd, bwd_s=bi + w, bwd_input_s=bi, bwd_weight_s=w, bwd_weight_batched_s=w,
                              step_s=a.get("step", 0.0), send_act_s=link.latency_ms / 1e3 if k < STAGES - 1 else 0.0,
                              send_grad_s=link.latency_ms / 1e3 if k > 0 else 0.0))
    return out


def stage_profile(zoo, size: int, load: int, link, repeats: int = 20):
    """The model's profile at ``size`` samples while one process standing in for the other stage
    trains on ``load`` samples (the microbatch: what that stage runs in the pipeline), with the
    measured ``link`` attached."""
    prof = profile_model(zoo.model, zoo.example_input(size), batch_size=size, optimizer=OPTIMIZER, model_name="mlp",
                         repeats=repeats, concurrent=STAGES - 1, load_input=zoo.example_input(load))
    prof.link = link
    return prof


def runtime_floor(cfg: RunConfig, steps: int = 40, runs: int = 2) -> tuple[float, ActionOverhead]:
    """The runtime's own cost per action: its step time on this schedule with the model shrunk
    to width 4 (compute next to nothing: what is left is the executor, the ``Stage`` calls, the
    transfers and the wake-ups on the way), divided by the number of actions on the schedule's
    critical path (the simulated step with every compute action and step costing 1). The fastest
    of ``runs`` runs counts."""
    tiny = cfg.with_(model_args={**MODEL_ARGS, "width": 4}, steps=steps)
    floor_s = min(measured_step_s(tiny)[0] for _ in range(runs))
    M = cfg.microbatches
    unit = [StageCosts(fwd_s=1.0, bwd_s=1.0, bwd_input_s=1.0, bwd_weight_s=1.0, bwd_weight_batched_s=1.0 / M,
                       step_s=1.0)] * STAGES
    path = steady_step_s(unit, cfg.schedule, M, batch_weight_grads=cfg.weight_grads == "batched")
    o = floor_s / path
    return floor_s, ActionOverhead(forward_s=o, backward_s=o, backward_input_s=o, weight_call_s=o, step_s=o)


def runtime_overhead(modules) -> tuple[list[int], list[ActionOverhead]]:
    """Per stage module: its count of layers with parameters, and the runtime's per-action
    overhead measured on a tiny stage of that many layers (the last one with the loss)."""
    counts = [sum(1 for m in mod.modules() if any(True for _ in m.parameters(recurse=False))) for mod in modules]
    return counts, [measure_action_overhead(n, k == len(counts) - 1) for k, n in enumerate(counts)]


def measured_step_s(cfg: RunConfig) -> tuple[float, dict]:
    sink = ActionTimes()
    summary = run_training(cfg, sink)
    if not summary["samples_per_s"]:
        raise RuntimeError(f"{cfg.schedule} ran too few steps for a steady-state rate: {summary['steps']}")
    return cfg.batch_size / summary["samples_per_s"], sink.means()


class Prediction:
    """``pipeboard.trainer.schedule.predict.predict_step_s`` fed what it is designed for: the model's
    profiles at the microbatch and the batch size (taken with the other stage's process training
    on microbatches), the measured link over the runtime's transport, and the runtime's per-action
    overhead (pipeboard.trainer.runtime.overhead's tiny-stage measurement, as a job's profile phase takes
    it). Each input is measured once, before the runs that it predicts. bench/runtime.py predicts
    its runs with it; ``weight_grads`` is theirs."""

    def __init__(self, weight_grads: str) -> None:
        self.weight_grads = weight_grads
        self.link = measure_link()
        self.profiles: dict[tuple[int, int], object] = {}  # (samples, the other stage's samples) -> profile
        self.overhead = None

    def _profile(self, zoo, size: int, load: int):
        """``stage_profile`` at ``size`` samples, the other stage on ``load``, measured once."""
        if (size, load) not in self.profiles:
            self.profiles[(size, load)] = stage_profile(zoo, size, load, self.link)
        return self.profiles[(size, load)]

    def step_s(self, schedule: str, **c) -> tuple[float, float]:
        """Predicted seconds per step: with the tiny-stage overhead, and with the runtime floor."""
        cfg = run_cfg(schedule, steps=1, weight_grads=self.weight_grads, **c)
        torch.set_num_threads(1)
        zoo = stage_modules.load_task(cfg)
        stages = stage_modules.stage_layers(cfg, zoo, STAGES)
        if self.overhead is None:
            modules = stage_modules.build_stages(zoo.model, zoo.example_input(cfg.microbatch_size), stages)
            self.overhead = runtime_overhead(modules)[1]
        mb = cfg.microbatch_size
        kw = dict(batch_profile=self._profile(zoo, cfg.batch_size, mb), batch_weight_grads=cfg.weight_grads == "batched")
        prof = self._profile(zoo, mb, mb)
        tiny = predict_step_s(prof, stages, cfg.schedule, cfg.microbatches, overhead=self.overhead, **kw)
        # the runtime floor: this schedule's whole runtime on the model shrunk to
        # width 4, per action on the critical path (measured here, before the runs it predicts)
        _, per_action = runtime_floor(cfg)
        floor = predict_step_s(prof, stages, cfg.schedule, cfg.microbatches, overhead=[per_action] * STAGES, **kw)
        return tiny, floor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=["a", "b", "both"], default="both")
    ap.add_argument("--schedules", default="1f1b,gpipe,pipedream,pipedream:1")
    ap.add_argument("--weight-grads", default="batched,immediate")
    ap.add_argument("--steps", type=int, default=20, help="steps per run in (a); (b) runs half as many")
    ap.add_argument("--runs", type=int, default=2, help="runs per case; the fastest counts")
    ap.add_argument("--repeats", type=int, default=20, help="profiled steps per profile")
    ap.add_argument("--costs", action="store_true", help="also print per-action costs: predicted vs recorded")
    ap.add_argument("--no-overhead", action="store_true", help="predict without the runtime's per-action overhead")
    ap.add_argument("--cpu-matmul", choices=["default", "onednn"], default=None,
                    help="float32 matrix products of the profiles and the runs (trainer/cpu_matmul.py; "
                         "default: $PIPEBOARD_CPU_MATMUL, else default)")
    args = ap.parse_args()
    cpu_matmul.use_with_children(args.cpu_matmul)  # the profiles (here and forked) and the runs' workers
    torch.set_num_threads(1)
    started = time.monotonic()
    print(f"predict vs measure: mlp depth=8 width=1024, {STAGES} stages, optimizer {OPTIMIZER}, "
          f"float32 matmul {cpu_matmul.active()}, "
          f"load average {os.getloadavg()[0]:.2f} at start, torch {torch.__version__}")
    link = measure_link()
    print(f"link ({link.backend}, one way, busy sender): latency {link.latency_ms:.3f} ms, "
          f"{link.bytes_per_ms * 1e3 / 1e9:.2f} GB/s, posting a send {link.post_ms:.3f} ms")
    names = ["a", "b"] if args.config == "both" else [args.config]
    schedules = args.schedules.split(",")
    zoo = stage_modules.load_task(run_cfg("1f1b", 64, 8, 1, "batched"))
    # (samples measured, samples the other stage's process trains on meanwhile): the microbatch,
    # and the batch (batched weight gradients) while the other stage runs microbatches
    needed = set()
    for n in names:
        for s in schedules:
            mb = CONFIGS[n]["batch_size"] // int(s.partition(":")[2] or CONFIGS[n]["microbatches"])
            needed |= {(mb, mb), (CONFIGS[n]["batch_size"], mb)}
    profiles = {}
    for size, load in sorted(needed):
        t = time.monotonic()
        profiles[(size, load)] = stage_profile(zoo, size, load, link, args.repeats)
        print(f"profile at {size} samples, the other stage on {load}: {time.monotonic() - t:.1f} s")
    modules = stage_modules.build_stages(zoo.model, zoo.example_input(8), stage_modules.stage_layers(
        run_cfg("1f1b", 64, 8, 1, "batched"), zoo, STAGES))
    counts, overhead = runtime_overhead(modules)
    print("runtime overhead per action (tiny stages of " + ", ".join(map(str, counts)) + " layers), ms: " + "; ".join(
        f"stage {k}: F {o.forward_s * 1e3:.3f} B {o.backward_s * 1e3:.3f} BI {o.backward_input_s * 1e3:.3f} "
        f"W(-1) {o.weight_call_s * 1e3:.3f} step {o.step_s * 1e3:.3f}" for k, o in enumerate(overhead)))
    if args.no_overhead:
        overhead = None
    rows = []
    for name in names:
        c = CONFIGS[name]
        steps = args.steps if name == "a" else max(8, args.steps // 2)
        for s in schedules:
            for mode in args.weight_grads.split(","):
                cfg = run_cfg(s, steps=steps, weight_grads=mode, **c)
                stages = stage_modules.stage_layers(cfg, zoo, STAGES)
                M, mb = cfg.microbatches, cfg.microbatch_size
                batched = mode == "batched"
                pred = predict_step_s(profiles[(mb, mb)], stages, cfg.schedule, M, batch_profile=profiles[(c["batch_size"], mb)],
                                      batch_weight_grads=batched, overhead=overhead)
                floor_s, per_action = runtime_floor(cfg, runs=args.runs)
                pred_floor = predict_step_s(profiles[(mb, mb)], stages, cfg.schedule, M,
                                            batch_profile=profiles[(c["batch_size"], mb)], batch_weight_grads=batched,
                                            overhead=[per_action] * STAGES)
                # other processes on the shared machine only ever slow a run down: keep the fastest
                tries = [measured_step_s(cfg) for _ in range(args.runs)]
                meas, actions = min(tries, key=lambda t: t[0])
                rows.append((name, s, mode, meas, pred, pred_floor))
                replay = steady_step_s(recorded_costs(actions, M, link), cfg.schedule, M, batch_weight_grads=batched)
                print(f"  ({name}) {s:12s} {mode:9s} measured {meas * 1e3:6.1f} ms/step "
                      f"(runs: {', '.join(f'{t[0] * 1e3:.1f}' for t in tries)}); predicted {pred * 1e3:6.1f} "
                      f"({pred / meas - 1:+.1%}), with the runtime floor {pred_floor * 1e3:6.1f} "
                      f"({pred_floor / meas - 1:+.1%}; floor {floor_s * 1e3:.1f} ms/step, "
                      f"{per_action.forward_s * 1e3:.2f} ms/action); on the run's recorded action times "
                      f"{replay * 1e3:6.1f} ({replay / meas - 1:+.1%})", flush=True)
                if args.costs:
                    costs = stage_costs(profiles[(mb, mb)], stages, microbatches=M,
                                        batch_profile=profiles[(c["batch_size"], mb)],
                                        overhead=overhead)
                    for k, sc in enumerate(costs):
                        rec = {kind: v * 1e3 for (w, kind), v in actions.items() if w == k}
                        pred_ms = {"F": sc.fwd_s, "B": sc.bwd_s, "BI": sc.bi_s, "W": sc.w_batched_s * M if batched
                                   else sc.w_s, "step": sc.step_s}
                        print(f"      stage {k}: " + ", ".join(
                            f"{kind} {v * 1e3:.2f}/{rec[kind]:.2f}" for kind, v in pred_ms.items() if kind in rec)
                            + " ms (predicted/recorded; F and B(I) include posting the send; recorded "
                            + ", ".join(f"{kind} {v:.2f}" for kind, v in rec.items() if kind.startswith(("send", "recv")))
                            + ")")
    print()
    for label, col in (("tiny-stage overhead", 4), ("runtime floor", 5)):
        errs = [abs(r[col] / r[3] - 1) for r in rows]
        print(f"{len(rows)} predictions with the {label}: mean |error| {statistics.fmean(errs):.1%}, "
              f"max {max(errs):.1%}, {sum(e <= 0.10 for e in errs)} within 10%")
    print(f"load average {os.getloadavg()[0]:.2f} at end; {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
