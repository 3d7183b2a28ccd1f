"""bench/runtime.py's other modes: ``--tta MODEL`` (time to accuracy under each schedule) and
``--instrumentation-pairs N`` (what recording every action costs)."""

from __future__ import annotations

import statistics
import time

import torch.multiprocessing as mp

from pipeboard.trainer.runtime import RunConfig, run_training


def time_to_accuracy(model: str, batch_size: int, microbatches: int) -> None:
    """Train ``model`` to its zoo target under each schedule on 2 processes; print the records."""
    from pipeboard.trainer.zoo import describe

    info = next(d for d in describe() if d["name"] == model)
    print(f"\ntime to accuracy: {model} to {info['metric']} {info['target']}, batch {batch_size} in "
          f"{microbatches} microbatches, 2 processes, the model's own optimizer")
    for schedule in ("pipedream", "1f1b", "gpipe", "dp"):
        layout = dict(workers=2) if schedule == "dp" else dict(num_stages=2)
        cfg = RunConfig(model=model, schedule=schedule, batch_size=batch_size, microbatches=microbatches,
                        target=info["target"], max_steps=3000, **layout)
        t = time.monotonic()
        s = run_training(cfg)
        hit = next((e for e in s["evaluations"] if (e["metric"] >= info["target"]) == info["higher_is_better"]), None)
        where = (f"reached at step {hit['step']} (epoch {hit['step'] / s['steps'] * s['epochs']:.1f}), "
                 f"{s['time_to_target_s']:.2f} s of training") if hit else "not reached"
        print(f"  {schedule:10s} {where}; final {info['metric']} {s['final_metric']:.4f}, "
              f"{s['samples_per_s']:.0f} samples/s, run wall {time.monotonic() - t:.1f} s")


def instrumentation_cost(pairs: int, schedule: str, steps: int, ours, config: dict) -> None:
    """Alternate instrumented and uninstrumented runs (``ours(schedule, steps, instrument, **config)``,
    bench/runtime.py's config (a)); print the paired ratios."""
    ratios, offs = [], []
    for _ in range(pairs):
        on = ours(schedule, steps, instrument=True, **config)
        off = ours(schedule, steps, instrument=False, **config)
        ratios.append(on / off)
        offs.append(off)
        print(f"  {schedule}: instrumented {on:7.1f}, uninstrumented {off:7.1f} samples/s ({on / off - 1:+.1%})", flush=True)
    print(f"instrumentation cost ({schedule}, config a, median of {pairs} back-to-back pairs): "
          f"{1 - statistics.median(ratios):+.1%} of throughput (end-to-end; the machine's noise dominates)")
    # The same cost measured directly: what instrumentation adds to one worker's step (recording
    # each of its actions, then shipping the step's events to the launcher), against the step time.
    from pipeboard.trainer.runtime.instrument import Recorder
    from pipeboard.trainer.schedule.actions import Kind

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    rec = Recorder(time.perf_counter())
    actions_per_step = 4 * config["microbatches"] + 1  # F, B, send, recv per microbatch + step
    n = 2000
    t = time.perf_counter()
    for i in range(n):
        for _ in range(actions_per_step):
            t0 = time.perf_counter()
            rec.record(Kind.FORWARD, 0, i, t0, time.perf_counter(), i)
        events, busy = rec.take()
        q.put(("step", 0, i, 0.0, busy, [], 0, events))
    per_step = (time.perf_counter() - t) / n
    for _ in range(n):
        q.get()
    step_s = config["batch_size"] / max(offs)  # the fastest step measured: the largest share
    print(f"  direct: {per_step * 1e6:.0f} us of instrumentation per worker step ({actions_per_step} actions) "
          f"against a {step_s * 1e3:.0f} ms step: {per_step / step_s:.2%} of throughput")
