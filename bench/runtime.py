"""Runtime benchmark: our schedules vs torch.distributed.pipelining vs the no-communication ceiling.

    .venv/bin/python bench/runtime.py [--config a|b|both] [--rounds R] [--steps N]
        [--weight-grads batched|immediate] [--cpu-matmul default|onednn]

(a) mlp depth=8 width=1024, batch 64 in 8 microbatches, 2 stages on 2 processes.
(b) the same model, batch 512 in 8 microbatches of 64 (compute-heavy).

In one invocation, alternating round by round, it measures samples/s of
- ours: ``run_training`` with 1f1b, gpipe and pipedream (steady state, instrumentation on; one
  weight update per batch in every schedule; batched weight gradients unless
  ``--weight-grads immediate``), and ``pipedream:1``: PipeDream's own configuration, whole
  minibatches of batch_size samples in flight, one update each (PipeDream needs no microbatches:
  minibatches in flight fill the pipeline);
- torch: ``torch.distributed.pipelining`` Schedule1F1B on the same stage modules;
- ceiling: each stage's compute exactly as our worker runs it (the same ``Stage`` calls on the
  same action list: versions, batched weight gradients, steps), both stages concurrently with no
  communication; the simulator then runs the schedule on those measured action times with free
  transfers, which places the bubble exactly;
- the two-process ceiling, as its own figures define it: two independent processes, each training the
  whole model on the microbatches (gradients accumulated, one update per batch), at once, their
  samples/s added, times 1 - the schedule's analytic bubble ((p - 1) / (m + p - 1) for 1f1b and
  gpipe, 0 for pipedream, whose pipeline stays full across updates). It has no stage imbalance:
  each process does every layer's work;
- one process, one thread, on the full batch;
and prints medians, every ratio next to its target (paired: the median of the
per-round ratios of runs made next to each other, or as near as one order allows; and of the
medians), the instrumentation cost (1f1b with and without event recording), and the simulator's
predicted step time fed the model's profile next to the measured one (the median run and the
fastest). Every process uses one torch thread, our workers' allocator settings (huge pages
included, as ``pipeboard train`` asks for them) and the same float32 matrix product kernels
(``--cpu-matmul``: PyTorch's BLAS by default, or oneDNN for all of them). The machine is shared:
numbers are noisy, so read the ratios, not single figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# bench/ holds scripts named like stdlib modules (profile.py): keep it off the import path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeboard.trainer.allocator import keep_freed_memory, prefer_huge_pages  # noqa: E402

prefer_huge_pages()  # as `pipeboard train` runs, for every process measured here (before torch allocates)

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from pipeboard.trainer import cpu_matmul  # noqa: E402
from pipeboard.trainer.runtime import RunConfig, run_training  # noqa: E402
from pipeboard.trainer.runtime import stage_modules  # noqa: E402
from pipeboard.trainer.runtime.data import TrainStream  # noqa: E402
from pipeboard.trainer.runtime.launch import free_port  # noqa: E402

CONFIGS = {
    "a": dict(batch_size=64, microbatches=8),
    "b": dict(batch_size=512, microbatches=8),
}
MODEL_ARGS = {"depth": 8, "width": 1024}
STAGES = 2
OPTIMIZER = os.environ.get("BENCH_OPTIMIZER", "sgd")
LR = 1e-4
WEIGHT_GRADS = ["batched"]  # --weight-grads: what our runs (and so their ceilings) use


def run_cfg(schedule: str, batch_size: int, microbatches: int, steps: int, instrument: bool = True) -> RunConfig:
    """``schedule`` may carry its own microbatch count: ``pipedream:1`` is pipedream on whole
    batches (one update per batch_size samples, as the synchronous runs make)."""
    name, _, own = schedule.partition(":")
    return RunConfig(model="mlp", model_args=MODEL_ARGS, schedule=name, batch_size=batch_size,
                     microbatches=int(own) if own else microbatches, num_stages=STAGES, steps=steps, eval_at_end=False,
                     optimizer=OPTIMIZER, lr=LR, instrument=instrument, weight_grads=WEIGHT_GRADS[0])


def ours(schedule: str, steps: int, instrument: bool = True, **c) -> float:
    return run_training(run_cfg(schedule, steps=steps, instrument=instrument, **c))["samples_per_s"]


def _stage_setup(cfg: RunConfig):
    zoo = stage_modules.load_task(cfg)
    layers = stage_modules.stage_layers(cfg, zoo, STAGES)
    modules = stage_modules.build_stages(zoo.model, zoo.example_input(cfg.microbatch_size), layers)
    return zoo, modules


class _Single(torch.nn.Module):
    """torch.distributed.pipelining wants a plain tensor out of the last stage."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *xs):
        out = self.inner(*xs)
        return out[0] if len(out) == 1 else out


def _torch_worker(rank: int, port: int, cfg: RunConfig, steps: int, out) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.set_num_threads(1)
    keep_freed_memory()  # every process here gets our workers' allocator settings
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=STAGES)
    zoo, modules = _stage_setup(cfg)
    module = _Single(modules[rank])
    opt = zoo.make_optimizer(module.parameters())
    stage = PipelineStage(module, rank, STAGES, torch.device("cpu"))
    sched = Schedule1F1B(stage, cfg.microbatches, loss_fn=zoo.loss)
    stream = TrainStream(zoo, cfg.batch_size, 1, torch.device("cpu"))
    times = []
    for k in range(steps):
        x, y = stream.microbatch(k)
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=y, losses=[])
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter())
    skip = max(1, steps // 10)
    if rank == STAGES - 1:
        out.put(cfg.batch_size * (steps - skip) / (times[-1] - times[skip - 1]))
    dist.barrier()
    dist.destroy_process_group()


def torch_1f1b(steps: int, **c) -> float:
    cfg = run_cfg("1f1b", steps=steps, **c)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    ps = [ctx.Process(target=_torch_worker, args=(r, port, cfg, steps, q)) for r in range(STAGES)]
    for p in ps:
        p.start()
    value = q.get(timeout=600)
    for p in ps:
        p.join(60)
    return value


def _stage_work(rank: int, cfg: RunConfig, steps: int, out) -> None:
    """Stage ``rank``'s compute for ``steps`` batches exactly as our worker runs it: the same
    ``Stage`` calls on the same action list (weight versions, batched weight gradients, steps and
    version releases included), with every transfer left out (inputs and output gradients are
    fixed tensors). Reports its samples/s and the mean seconds of each action kind."""
    from pipeboard.trainer.schedule.stash import version_last_use
    from pipeboard.trainer.runtime.layout import resolve
    from pipeboard.trainer.runtime.stage import Stage
    from pipeboard.trainer.schedule.actions import Kind

    torch.set_num_threads(1)
    keep_freed_memory()
    zoo, modules = _stage_setup(cfg)
    layout, M, last = resolve(cfg), cfg.microbatches, rank == STAGES - 1
    pipelined = cfg.schedule == "pipedream"  # one schedule for the whole run (a single segment)
    actions = [a for a in layout.build(steps * M if pipelined else M).actions[rank]
               if a.kind.is_compute or a.kind is Kind.STEP]
    last_use, releases = version_last_use(actions)
    stage = Stage(rank, modules[rank], zoo.make_optimizer(modules[rank].parameters()), is_first=rank == 0,
                  is_last=last, loss_fn=zoo.loss, stash=pipelined, loss_scale=1.0 / M,
                  layer_calls=any(a.kind is Kind.BACKWARD_INPUT for a in actions))
    stream = TrainStream(zoo, cfg.batch_size, M, torch.device("cpu"))
    # A real microbatch's activation and output gradient (their magnitudes matter: gradients of
    # ones would grow the weights step by step into slow non-finite arithmetic). Two stages.
    x0, y0 = stream.microbatch(0)
    with torch.no_grad():
        act = tuple(modules[0](x0))
    probe = [a.detach().requires_grad_(True) for a in act]
    (zoo.loss(modules[1](*probe)[0], y0) / M).backward()
    grad = None if last else [p.grad for p in probe]
    for module in modules:
        module.zero_grad(set_to_none=True)
    spent: dict[str, list[float]] = {}
    covered = 0  # microbatches the batched W of the measured steps covered
    times = []
    skip = max(1, steps // 10)
    for k in range(1 if pipelined else steps):
        base = 0 if pipelined else k * M
        for i, a in enumerate(actions):
            t0 = time.perf_counter()
            if a.kind is Kind.FORWARD:
                x, y = stream.microbatch(base + a.microbatch)  # what the worker's data callable does
                stage.forward(a.microbatch, a.version, [x] if rank == 0 else [t.clone() for t in act],
                              y if last else None)
            elif a.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
                stage.backward(a.microbatch, grad, weights=a.kind is Kind.BACKWARD)
            elif a.kind is Kind.BACKWARD_WEIGHT:
                n = len(stage.pending_weights) if a.microbatch < 0 else 1
                stage.backward_weight(a.microbatch)
            else:
                stage.step(a.version, last_use.get((rank, stage.versions.current), -1) > i)
                times.append(time.perf_counter())
            if len(times) >= skip:  # steady state only
                spent.setdefault(a.kind.value, []).append(time.perf_counter() - t0)
                if a.kind is Kind.BACKWARD_WEIGHT:
                    covered += n
            for _, v in releases.get(i, ()):
                stage.versions.release(v)
        if pipelined:
            stage.versions.reset(0)
    mean = {kind: sum(v) / len(v) for kind, v in spent.items()}
    if "W" in mean:
        mean["W"] = sum(spent["W"]) / covered  # per microbatch covered
    out.put((rank, cfg.batch_size * (len(times) - skip) / (times[-1] - times[skip - 1]), mean))


def ceiling(steps: int, schedule: str, **c) -> float:
    """Samples/s of our schedule with free, instant transfers: both stages run their compute
    concurrently (``_stage_work``, sharing the machine as in a run); the simulator then runs the
    schedule step after step on those measured action times with no communication cost, which
    places the pipeline bubble (fill, drain, where the batched W and the step fall) exactly."""
    from pipeboard.trainer.runtime.layout import resolve
    from pipeboard.trainer.schedule.action_costs import StageCosts
    from pipeboard.trainer.schedule.predict import steady_step_s

    cfg = run_cfg(schedule, steps=steps, **c)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=_stage_work, args=(r, cfg, steps, q)) for r in range(STAGES)]
    for p in ps:
        p.start()
    means = dict((r, m) for r, _, m in (q.get(timeout=600) for _ in ps))
    for p in ps:
        p.join(60)
    costs = []
    for r in range(STAGES):
        m = means[r]
        bi = m.get("BI", m.get("B", 0.0))
        w = m.get("W", 0.0)
        costs.append(StageCosts(fwd_s=m["F"], bwd_s=bi + w, bwd_input_s=bi, bwd_weight_s=w, bwd_weight_batched_s=w,
                                step_s=m["step"]))
    # steady state, as the runtime runs step after step (a step's first forwards overlap the
    # previous step's drain): the simulator's difference between long and short runs
    return cfg.batch_size / steady_step_s(costs, cfg.schedule, cfg.microbatches,
                                          batch_weight_grads=resolve(cfg).batch_weight_grads)


def _whole_model_worker(cfg: RunConfig, steps: int, microbatches: int, start, finished, out) -> None:
    """One process, one thread, training the whole model: ``microbatches`` per batch with their
    gradients accumulated (1: the full batch at once), one update per batch. With others
    (``start``: a barrier; ``finished``: a shared count), it starts with them and keeps training,
    untimed, until every one has timed its ``steps``, so that each timed window lies wholly in
    the time they all run."""
    torch.set_num_threads(1)
    keep_freed_memory()
    zoo = stage_modules.load_task(cfg)
    opt = zoo.make_optimizer(zoo.model.parameters())
    stream = TrainStream(zoo, cfg.batch_size, microbatches, torch.device("cpu"))

    def train_step(k: int) -> None:
        for i in range(microbatches):
            x, y = stream.microbatch(k * microbatches + i)
            loss = zoo.loss(zoo.model(x), y)
            (loss if microbatches == 1 else loss / microbatches).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if start is not None:
        start.wait(timeout=300)
    times = []
    for k in range(steps):
        train_step(k)
        times.append(time.perf_counter())
    skip = max(1, steps // 10)
    out.put(cfg.batch_size * (steps - skip) / (times[-1] - times[skip - 1]))
    if finished is not None:
        with finished.get_lock():
            finished.value += 1
        k = steps
        while finished.value < start.parties:
            train_step(k)
            k += 1


def whole_model(steps: int, processes: int, splits: int, **c) -> float:
    """Samples/s of ``processes`` independent processes training the whole model at once, each
    on batches split in ``splits`` microbatches (``_whole_model_worker``; their rates added): no
    stages, no transfers."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    start = ctx.Barrier(processes) if processes > 1 else None
    finished = ctx.Value("i", 0) if processes > 1 else None
    cfg = run_cfg("1f1b", steps=steps, **c)
    ps = [ctx.Process(target=_whole_model_worker, args=(cfg, steps, splits, start, finished, q), daemon=True)
          for _ in range(processes)]
    for p in ps:
        p.start()
    value = sum(q.get(timeout=600) for _ in ps)
    for p in ps:
        p.join(60)
    return value


def single(steps: int, **c) -> float:
    """One process, one thread, the full batch per step."""
    return whole_model(steps, 1, 1, **c)


def microbatches_of(schedule: str, c: dict) -> int:
    """The microbatches per batch a benchmarked schedule runs (``pipedream:1``: 1)."""
    return run_cfg(schedule, steps=1, **c).microbatches


def whole_model_anchors(schedules: list[str], c: dict) -> set[str]:
    """Per microbatch count, the schedule whose runs the whole-model processes run beside:
    pipedream's (the 1.6x target compares it with one process), else the first."""
    anchors: dict[int, str] = {}
    for s in schedules:
        m = microbatches_of(s, c)
        if m not in anchors or (s.startswith("pipedream") and not anchors[m].startswith("pipedream")):
            anchors[m] = s
    return set(anchors.values())


def _sibling(name: str):
    """A module of bench/ loaded from its file (bench/ stays off the import path, see above)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=["a", "b", "both"], default="both")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--schedules", default="1f1b,gpipe,pipedream,pipedream:1",
                    help="comma-separated; name:M overrides the microbatch count (pipedream:1 = whole batches)")
    ap.add_argument("--tta", metavar="MODEL", help="instead: time to accuracy of a zoo model (e.g. mlp-digits)")
    ap.add_argument("--instrumentation-pairs", type=int, metavar="N",
                    help="instead: N back-to-back instrumented/uninstrumented pairs (gpipe, config a)")
    ap.add_argument("--weight-grads", choices=["batched", "immediate"], default="batched",
                    help="our runs' weight gradients: one batched pass per update (default) or in each backward")
    ap.add_argument("--cpu-matmul", choices=["default", "onednn"], default=None,
                    help="float32 matrix products of every process measured (trainer/cpu_matmul.py; "
                         "default: $PIPEBOARD_CPU_MATMUL, else default)")
    args = ap.parse_args()
    WEIGHT_GRADS[0] = args.weight_grads
    cpu_matmul.use_with_children(args.cpu_matmul)  # every process measured here: the same kernels
    if args.instrumentation_pairs:
        _sibling("runtime_modes").instrumentation_cost(args.instrumentation_pairs, "gpipe", args.steps, ours,
                                                        CONFIGS["a"])
        return
    if args.tta:
        _sibling("runtime_modes").time_to_accuracy(args.tta, 64, 4)
        return
    torch.set_num_threads(1)
    schedules = args.schedules.split(",")
    print(f"runtime benchmark: mlp depth=8 width=1024, {STAGES} stages, optimizer {OPTIMIZER}, "
          f"weight gradients {WEIGHT_GRADS[0]}, float32 matmul {cpu_matmul.active()}, "
          f"{os.cpu_count()} CPUs (shared machine: noisy), torch {torch.__version__}, no GPU")
    prediction = _sibling("predict").Prediction(WEIGHT_GRADS[0])
    report_of = _sibling("runtime_report")
    for name in (["a", "b"] if args.config == "both" else [args.config]):
        c = CONFIGS[name]
        steps = args.steps if name == "a" else max(8, args.steps // 2)
        predicted = {s: prediction.step_s(s, **c) for s in schedules}  # inputs measured before the runs
        res: dict[str, list[float]] = {}
        anchors = whole_model_anchors(schedules, c)
        for r in range(args.rounds):
            # Runs compared directly run next to each other, so load drift hits both alike: the
            # uninstrumented run beside ours 1f1b (torch one further), each schedule beside its
            # ceiling, and the two-process ceiling (the whole-model processes, measured once per
            # microbatch count) beside ours pipedream and the one process. Odd rounds run the
            # list backwards, so neither side of a pair always goes first.
            jobs = [("torch Schedule1F1B", lambda: torch_1f1b(steps, **c))]
            for s in schedules:
                if name == "a" and s == "1f1b":
                    jobs.append(("ours 1f1b uninstrumented", lambda: ours("1f1b", steps, instrument=False, **c)))
                jobs.append((f"ceiling {s}", lambda s=s: ceiling(steps, s, **c)))
                jobs.append((f"ours {s}", lambda s=s: ours(s, steps, **c)))
                if s in anchors:  # the two-process ceiling, before the bubble
                    m = microbatches_of(s, c)
                    jobs.append((report_of.whole_label(m, STAGES), lambda m=m: whole_model(steps, STAGES, m, **c)))
                if s == "pipedream":
                    jobs.append(("one process full batch", lambda: single(steps, **c)))
            if "pipedream" not in schedules:
                jobs.append(("one process full batch", lambda: single(steps, **c)))
            for label, fn in (jobs if r % 2 == 0 else jobs[::-1]):
                res.setdefault(label, []).append(fn())
            print(f"  config {name} round {r + 1}/{args.rounds} done", flush=True)
        report_of.report(name, c, steps, args.rounds, schedules, res, predicted,
                         {s: microbatches_of(s, c) for s in schedules}, STAGES)


if __name__ == "__main__":
    main()
