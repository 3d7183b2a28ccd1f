"""What the runtime's own code adds to each action of a stage, beyond the compute a profile times.

``measure_action_overhead(layers, last)`` runs the runtime's ``Stage`` calls (F, B, BI, one
W(-1) per round, the optimizer step) on a stage of ``layers`` Linear(4, 4)+ReLU layers on one
sample, where the compute is next to nothing, and subtracts the plain module's forward, backward
and optimizer step on the same tensors (what a profile would time). What is left is the Stage's
bookkeeping: its per-layer call recording, stashing checks, the loss on the last stage, the
weight-gradient bookkeeping of BI and W(-1).

``calibrate()`` measures a few stage shapes (layer counts, last or not) into the profile's
``overhead`` field (``pipeboard.trainer.profile.schema.Overhead``), which ``Overhead.at(layers, last)``
interpolates for a real stage; ``pipeboard.trainer.schedule.predict`` adds it to each action's cost.

Medians over the rounds after the first fifth (warm-up), so a preempted call on a shared
machine does not count.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

import torch

from pipeboard.trainer.profile.schema import Overhead
from pipeboard.trainer.runtime.stage import Stage
from pipeboard.trainer.schedule.predict import ActionOverhead

# Stage shapes calibrate() measures: the overhead grows with the stage's parameterised layers
# (each is recorded and, for W(-1), handled on its own), and the last stage adds the loss.
CALIBRATION_LAYERS = (1, 4)


def _median_s(xs: list[float]) -> float:
    return statistics.median(xs[len(xs) // 5:])


def measure_action_overhead(layers: int, last: bool, microbatches: int = 8, rounds: int = 40) -> ActionOverhead:
    """Seconds the runtime's ``Stage`` adds to each action of a stage of ``layers``
    parameterised layers (the last stage computes the loss in its forward), over
    ``microbatches`` microbatches per round (W(-1) batches them all)."""
    if layers < 1 or microbatches < 1 or rounds < 1:
        raise ValueError(f"layers, microbatches and rounds must be >= 1, got {layers}, {microbatches}, {rounds}")

    def tiny():
        torch.manual_seed(0)
        mod = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(4, 4), torch.nn.ReLU())])
        return mod, torch.optim.SGD(mod.parameters(), lr=1e-4, momentum=0.9)

    x, y, g = torch.randn(1, 4), torch.randn(1, 4), torch.ones(1, 4)
    mod, opt = tiny()
    stage = Stage(1, mod, opt, is_first=False, is_last=last, loss_fn=torch.nn.functional.mse_loss, stash=False,
                  loss_scale=1 / microbatches, layer_calls=True)
    plain, plain_opt = tiny()
    t: dict[str, list[float]] = defaultdict(list)
    clock = time.perf_counter
    for _ in range(rounds):
        for split in (True, False):
            for j in range(microbatches):
                t0 = clock()
                stage.forward(j, 0, [x.clone()], y if last else None)
                t["F"].append(clock() - t0)
                t0 = clock()
                stage.backward(j, None if last else [g], weights=not split)
                t["BI" if split else "B"].append(clock() - t0)
            if split:
                t0 = clock()
                stage.backward_weight(-1)
                t["W"].append(clock() - t0)
            t0 = clock()
            stage.step(0, False)
            t["step"].append(clock() - t0)
        for frozen in (False, True):  # frozen parameters: autograd computes input gradients only, as BI
            for p in plain.parameters():
                p.requires_grad_(not frozen)
            for _ in range(microbatches):
                xi = x.clone().requires_grad_(True)
                t0 = clock()
                out = plain(xi)
                t["pF"].append(clock() - t0)
                t0 = clock()
                out.backward(g)
                t["pBI" if frozen else "pB"].append(clock() - t0)
        t0 = clock()
        plain_opt.step()
        t["pstep"].append(clock() - t0)
        for p in plain.parameters():
            p.grad = None
    m = {k: _median_s(v) for k, v in t.items()}
    return ActionOverhead(forward_s=max(0.0, m["F"] - m["pF"]), backward_s=max(0.0, m["B"] - m["pB"]),
                          backward_input_s=max(0.0, m["BI"] - m["pBI"]),
                          weight_call_s=max(0.0, m["W"] - (m["pB"] - m["pBI"])),
                          step_s=max(0.0, m["step"] - m["pstep"]))


def calibrate(layer_counts: tuple[int, ...] = CALIBRATION_LAYERS, microbatches: int = 8, rounds: int = 40) -> Overhead:
    """The runtime's per-action overhead on stages of each of ``layer_counts`` layers, last and
    not last, as a profile's ``overhead`` (milliseconds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each runtime worker runs
    try:
        samples = []
        for last in (False, True):
            for n in layer_counts:
                o = measure_action_overhead(n, last, microbatches=microbatches, rounds=rounds)
                samples.append({"layers": n, "last": last, "forward_ms": o.forward_s * 1e3,
                                "backward_ms": o.backward_s * 1e3, "backward_input_ms": o.backward_input_s * 1e3,
                                "weight_call_ms": o.weight_call_s * 1e3, "step_ms": o.step_s * 1e3})
    finally:
        torch.set_num_threads(threads)
    return Overhead(samples=samples, microbatches=microbatches)
