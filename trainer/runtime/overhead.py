"""What the runtime's own code adds to each action of a stage, beyond the compute a profile times.

``measure_action_overhead(layers, last)`` runs the runtime's ``Stage`` calls (F, B, BI, one
W(-1) per round, the optimizer step) on a stage of ``layers`` Linear(4, 4)+ReLU layers on one
sample, where the compute is next to nothing, and subtracts the plain module's forward, backward
and optimizer step on the same tensors (what a profile would time). What is left is the Stage's
bookkeeping: its per-layer call recording, stashing checks, the loss on the last stage, the
weight-gradient bookkeeping of BI and W(-1).

``measure_executor_overhead()`` measures what the runtime spends outside the spans it records:
the ``Executor``'s walk per action, and per step its set-up and the worker's step report.
``measure_data_load(task, ...)`` times a task's own data loading per step, first and last stage.
``measure_generic_weight_overhead()`` what W adds per non-Linear parameterised layer and microbatch.
``measure_stash_copy()`` what weight stashing adds to a step that keeps the version it replaces.

``calibrate()`` measures a few stage shapes (layer counts, last or not) and the executor into the
profile's ``overhead`` field (``pipeboard.trainer.profile.calibration_records.Overhead``), which
``Overhead.at(layers, last)`` interpolates for a real stage; ``pipeboard.trainer.schedule.predict``
adds it to each action's cost, and the per-step part to each stage's step.

Medians over the rounds after the first fifth (warm-up), so a preempted call on a shared
machine does not count.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

import torch

from pipeboard.trainer.profile.calibration_records import Overhead
from pipeboard.trainer.runtime.stage import Stage
from pipeboard.trainer.schedule.predict import ActionOverhead

# Stage shapes calibrate() measures: the overhead grows with the stage's parameterised layers
# (each is recorded and, for W(-1), handled on its own), and the last stage adds the loss.
CALIBRATION_LAYERS = (1, 4)
# Weight sizes measure_stash_copy times: one that stays in a server's caches, one far past them.
STASH_COPY_BYTES = (4 << 20, 64 << 20)


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


def measure_generic_weight_overhead(layers: int = 4, microbatches: int = 4, rounds: int = 30) -> float:
    """Seconds the runtime's W adds per parameterised layer that is not a plain Linear, per
    microbatch: W computes those one microbatch and one layer at a time (an ``autograd.grad``
    from the layer's output to its parameters, ``weightgrad._generic_weights``), where a Linear's
    is one matmul over all the microbatches. Measured on a stage of ``layers`` LayerNorm(4)
    layers: its W(-1) over ``microbatches`` microbatches, minus the plain module's weight
    gradients (one ``autograd.grad`` for all its layers) as often, per layer and microbatch. One
    torch thread, as the workers (a tiny backward on a pool whose other core is busy waits for
    it: 100 ms against 0.6 ms measured)."""
    if layers < 1 or microbatches < 1 or rounds < 5:
        raise ValueError(f"layers, microbatches >= 1 and rounds >= 5, got {layers}, {microbatches}, {rounds}")

    def tiny():
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.LayerNorm(4) for _ in range(layers)])

    mod = tiny()
    stage = Stage(1, mod, torch.optim.SGD(mod.parameters(), lr=1e-4), is_first=False, is_last=False,
                  loss_fn=None, stash=False, loss_scale=1.0, layer_calls=True)
    plain = tiny()
    params = list(plain.parameters())
    x, g = torch.randn(1, 4), torch.ones(1, 4)
    clock = time.perf_counter
    w, plain_w = [], []
    for r in range(rounds + 3):  # three rounds first to warm up, not kept
        for j in range(microbatches):
            stage.forward(j, 0, [x.clone()], None)
            stage.backward(j, [g], weights=False)
        t0 = clock()
        stage.backward_weight(-1)
        if r >= 3:
            w.append(clock() - t0)
        stage.step(0, False)
        out = plain(x)
        t0 = clock()
        torch.autograd.grad(out, params, g)  # the weight gradients alone, one autograd call for all layers
        if r >= 3:
            plain_w.append(clock() - t0)
    compute = _median_s(plain_w) * microbatches
    return max(0.0, _median_s(w) - compute) / (layers * microbatches)


class _NoTransfers:
    """The P2P of a one-stage run: nothing is ever sent, so nothing is waited for."""

    def flush(self) -> None:
        pass


def measure_executor_overhead(microbatches: tuple[int, int] = (2, 8), rounds: int = 30) -> tuple[float, float]:
    """(seconds per action, seconds per step) that the runtime spends outside the action spans
    it records: the ``Executor``'s walk of the action list (receive posting, recording, the
    heartbeat, weight-version releases), its per-step set-up, and the worker's step report
    (``StepReports``, onto a real ``multiprocessing`` queue). It runs the ``Executor`` on a
    one-stage gpipe schedule of a tiny stage (batched weight gradients, one update per step) for
    ``rounds`` steps at each of two microbatch counts; per step, the wall time minus the
    recorded spans is linear in the actions walked: the two counts give the slope (per action)
    and the intercept (per step). Data comes ready-made: loading a batch is the task's own cost
    (``measure_data_load``). Medians after the first fifth."""
    import multiprocessing

    from pipeboard.trainer.runtime.executor import Executor
    from pipeboard.trainer.runtime.instrument import Heartbeat, Recorder, StepReports
    from pipeboard.trainer.schedule.builder import build

    if len(microbatches) != 2 or microbatches[0] == microbatches[1] or rounds < 5:
        raise ValueError(f"two different microbatch counts and >= 5 rounds, got {microbatches}, {rounds}")
    queue = multiprocessing.get_context("fork").Queue()
    x, y = torch.randn(1, 4), torch.randn(1, 4)
    runs = []
    for m in microbatches:
        torch.manual_seed(0)
        mod = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
        stage = Stage(0, mod, torch.optim.SGD(mod.parameters(), lr=1e-4), is_first=True, is_last=True,
                      loss_fn=torch.nn.functional.mse_loss, stash=False, loss_scale=1 / m, layer_calls=True)
        actions = build("gpipe", 1, m, batch_weight_grads=True).actions[0]
        recorder = Recorder(time.perf_counter())
        executor = Executor(0, {0: stage}, 1, _NoTransfers(), lambda s, mb: 0, {}, recorder, Heartbeat())
        walked = sum(1 for a in actions if a.kind.is_compute or a.kind.value in ("step", "allreduce"))
        runs.append((executor, actions, recorder, stage, StepReports(queue, 0), walked, []))
    try:
        for k in range(rounds):  # the two counts alternate, so that drift on a shared machine hits both
            for executor, actions, recorder, stage, reports, _, outside in runs:
                spans = []

                def done(k: int, recorder=recorder, stage=stage, reports=reports, spans=spans) -> None:
                    spans.append(sum(e[4] - e[3] for e in recorder.events))
                    reports.step_done(k, recorder, stage)

                t0 = time.perf_counter()
                executor.run(actions, lambda mb: (x, y), step_of=lambda mb: 0, on_step_done=done)
                outside.append(time.perf_counter() - t0 - spans[0])
        for run in runs:
            run[4].flush()
    finally:
        queue.cancel_join_thread()
        queue.close()
    points = [(walked, _median_s(outside)) for *_, walked, outside in runs]
    (n1, o1), (n2, o2) = points
    per_action = max(0.0, (o2 - o1) / (n2 - n1))
    return per_action, max(0.0, o1 - per_action * n1)


def measure_data_load(task, batch_size: int, microbatches: int, steps: int = 12) -> tuple[float, float]:
    """Seconds per step the first stage (inputs and targets) and the last stage (targets, where
    the data set gives them alone) spend getting their microbatches of a batch from the task's
    data (``TrainStream``, as the runtime's workers, in this process: with loader workers the
    cost is theirs, off the training process)."""
    from pipeboard.trainer.runtime.data import TrainStream

    out = []
    for inputs in (True, False):
        stream = TrainStream(task, batch_size, microbatches, torch.device("cpu"), 0, load=True, inputs=inputs)
        times = []
        for k in range(min(steps, stream.steps_per_epoch)):
            t0 = time.perf_counter()
            for j in range(microbatches):
                stream.microbatch(k * microbatches + j)
            times.append(time.perf_counter() - t0)
        out.append(statistics.median(times[1:] or times))
    return out[0], out[1]


def measure_stash_copy(sizes: tuple[int, ...] = STASH_COPY_BYTES, rounds: int = 10) -> list[list[float]]:
    """[weight bytes, ms] per size: what ``WeightVersions.step`` (weight stashing, Adam) adds when
    it must keep the version it replaces (the weights moved to fresh storage from the version
    pool, then the update) over the same step in place, alternating the two."""
    from pipeboard.trainer.runtime.versions import WeightVersions

    out = []
    for nbytes in sizes:
        module = torch.nn.Module()
        for k in range(4):  # a stage's weights come in several tensors
            module.register_parameter(f"w{k}", torch.nn.Parameter(torch.randn(nbytes // 16)))
        params = list(module.parameters())
        versions = WeightVersions(module, torch.optim.Adam(params, lr=1e-4), stash=True)
        grads = [torch.full_like(p, 1e-3) for p in params]
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(rounds):
            for keep in (True, False):
                for p, g in zip(params, grads):
                    p.grad = g
                old = versions.current
                t0 = time.perf_counter()
                versions.step(old + 1, keep)
                times[keep].append(time.perf_counter() - t0)
                if keep:  # its last use passed: back to the pool, as the executor releases it
                    versions.release(old)
        out.append([float(nbytes), max(0.0, _median_s(times[True]) - _median_s(times[False])) * 1e3])
    return out


def calibrate(layer_counts: tuple[int, ...] = CALIBRATION_LAYERS, microbatches: int = 8, rounds: int = 40) -> Overhead:
    """The runtime's per-action overhead on stages of each of ``layer_counts`` layers, last and
    not last, and the executor's per action and per step, as a profile's ``overhead``
    (milliseconds; the data loading fields are the task's, left unset here)."""
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
        per_action, per_step = measure_executor_overhead()
        generic = measure_generic_weight_overhead()
        stash_copy = measure_stash_copy()
    finally:
        torch.set_num_threads(threads)
    return Overhead(samples=samples, microbatches=microbatches, executor_action_ms=per_action * 1e3,
                    executor_step_ms=per_step * 1e3, generic_weight_ms=generic * 1e3, stash_copy=stash_copy)
