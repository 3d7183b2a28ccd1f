"""One worker process: set up its stages and communication, then train, top to bottom.

The same function runs under the local launcher (``torch.multiprocessing``) and under torchrun
(rank, world and rendezvous from the environment). What it reports goes through ``channel``
(``put(message)``); the launcher turns those messages into sink calls.
"""

from __future__ import annotations

import gc
import os
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from pipeboard.trainer import cpu_matmul
from pipeboard.trainer.allocator import keep_freed_memory
from pipeboard.trainer.precision import autocast
from pipeboard.trainer.runtime import checkpoint, stage_modules, tied
from pipeboard.trainer.runtime.comm import P2P, node_name, open_channels, p2p_mode
from pipeboard.trainer.runtime.run_config import RunConfig
from pipeboard.trainer.runtime.data import TrainStream, ValStream, token_counter
from pipeboard.trainer.runtime.executor import Executor
from pipeboard.trainer.runtime.fault_injection import InjectedFault
from pipeboard.trainer.runtime.instrument import Heartbeat, Recorder, StepReports
from pipeboard.trainer.runtime.layout import Layout, resolve
from pipeboard.trainer.runtime.plan_steps import eval_actions, segment_ends, total_steps
from pipeboard.trainer.runtime.gpu_share import pair_transport, shares_a_gpu
from pipeboard.trainer.runtime.posting import lookahead_for, run_lookahead
from pipeboard.trainer.runtime.stage import Stage
from pipeboard.trainer.runtime.stage_memory import error_message
from pipeboard.trainer.schedule.actions import Kind
from pipeboard.trainer.task.metrics import join, join_targets


@dataclass
class WorkerEnv:
    rank: int
    world: int
    init_method: str  # e.g. tcp://127.0.0.1:29500
    origin: float | None  # the launcher's perf_counter origin (same machine), None: agree at start
    channel: Any  # has put(message)
    heartbeat: Any = None  # shared double array (local launcher) or None
    shm_prefix: str | None = None  # names of this run's shared-memory channels (None: rank 0 picks)
    gpus: tuple[int, ...] | None = None  # rank -> its visible GPU, the launcher's (None: LOCAL_RANK)


def worker_main(cfg: RunConfig, env: WorkerEnv) -> None:
    """Process entry: run, report any failure with its stage and rank, exit non-zero on error."""
    _set_up_process(env.rank)
    keep_freed_memory()
    stage_ids: tuple[int, ...] = ()
    try:
        cfg.spec  # noqa: B018  (a run's own schedule file is registered in this process too: spawned workers)
        stage_ids = _stages_of(cfg, env.rank)
        train(cfg, env)
        env.channel.put(("exit", env.rank))
    except BaseException as exc:  # report, then fail the process
        env.channel.put(("error", env.rank, list(stage_ids), error_message(exc, cfg.device), traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _set_up_process(rank: int) -> None:
    """Linux: get SIGKILL when the launcher dies, so no worker outlives a killed run; and be named
    ``pipeboard-rN`` (what ps, top and /proc/PID/comm show) rather than a copy of the launcher."""
    try:
        import ctypes
        import signal

        # forked from a launcher that may hand over on SIGTERM (app/core/lifetime.py): a stage ends at once
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        libc.prctl(15, f"pipeboard-r{rank}".encode()[:15])  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def run_device(kind: str, rank: int, gpus: tuple[int, ...] | None = None) -> torch.device:
    """This worker's device. On a GPU: ``cuda:gpus[rank]`` where the launcher assigned the GPUs
    (several stage processes may share one, launch.gpu_devices), else ``cuda:LOCAL_RANK`` (the
    rank among this host's workers; torchrun sets it), modulo the GPUs this process sees
    (``CUDA_VISIBLE_DEVICES`` is how the service hands a run its GPUs). RuntimeError in one line
    where torch sees no GPU."""
    if kind != "cuda":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 0:
        raise RuntimeError("device cuda: torch sees no GPU on this host (torch.cuda.device_count() is 0, "
                           f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')})")
    index = gpus[rank] if gpus is not None else int(os.environ.get("LOCAL_RANK", rank))
    return torch.device(f"cuda:{index % count}")


def _stages_of(cfg: RunConfig, rank: int) -> tuple[int, ...]:
    return resolve(cfg).stages_of(rank)


def train(cfg: RunConfig, env: WorkerEnv) -> None:
    rank, world = env.rank, env.world
    torch.set_num_threads(cfg.threads or threads_per_worker(world))
    device = run_device(cfg.device, rank, env.gpus)
    # Several ranks on one GPU: NCCL refuses a communicator with two ranks on a device, so the world
    # group (and so every collective) is gloo, and NCCL carries only transfers between GPUs.
    shared = device.type == "cuda" and env.gpus is not None and shares_a_gpu(env.gpus)
    if device.type == "cpu":
        cpu_matmul.use(cfg.cpu_matmul)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=cfg.hang_timeout_s + 60)
    dist.init_process_group("nccl" if device.type == "cuda" and not shared else "gloo", init_method=env.init_method,
                            rank=rank, world_size=world, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout) if device.type == "cuda" else None

    # ---- model, stages, optimizers ----------------------------------------------------------
    layout: Layout = resolve(cfg)
    M = cfg.microbatches
    template = layout.build(M)  # one batch (pipedream: M is a multiple of every replica count)
    me = template.workers[rank]
    task = stage_modules.load_task(cfg)
    example = task.example_input(cfg.microbatch_size)
    dynamic = task.varying_dims(cfg.microbatch_size)  # sizes that vary by batch: one capture for all
    count_tokens = token_counter(task, dynamic)  # before task.model goes: the mask is found by its name
    modules = stage_modules.build_stages(task.model, example,
                                         stage_modules.stage_layers(cfg, task, layout.virtual_stages),
                                         task.layers, dynamic)
    specs = stage_modules.boundary_specs(modules, example, cfg.precision, device.type, dynamic)
    S = len(modules)
    stash = cfg.is_async
    data_parallel = cfg.spec.data_parallel  # DDP: the all-reduce runs inside the backward
    # A batch's gradient is the mean over its samples: each microbatch's loss is scaled by 1/M and
    # replicas sum (pipedream too: it updates once per batch); DDP averages, hence N/M.
    scale = layout.world / M if data_parallel else 1.0 / M
    groups = {}
    for s in range(S):  # every rank creates every group, in the same order
        ranks = tuple(template.workers[w].rank for w in range(world) if s in template.workers[w].stages)
        if len(ranks) > 1:
            groups[ranks] = dist.new_group(list(ranks))
    # parameters shared by stages (tied weights): one gradient sum before each update
    tied_grads = tied.TiedGrads(cfg, layout, template, rank, tied.find(modules, task.model))
    split = any(a.kind is Kind.BACKWARD_INPUT for a in template.actions[rank])  # BI/W need the layers' calls
    stages: dict[int, Stage] = {}
    for s in me.stages:
        module = tied_grads.localize(s, modules[s].to(device))
        ddp = None
        if data_parallel and world > 1:
            ddp = torch.nn.parallel.DistributedDataParallel(module, process_group=None)
        stages[s] = Stage(s, module, task.make_optimizer(module.parameters(), cfg.lr), is_first=s == 0,
                          is_last=s == S - 1, loss_fn=task.loss, stash=stash, loss_scale=scale, ddp=ddp,
                          layer_calls=split, autocast=lambda: autocast(device.type, cfg.precision),
                          recompute=s in (cfg.recompute or ()))
    # Every worker built the whole model (same seed, same weights); keep only its own stages, so
    # a worker's memory is its stages' memory.
    del modules, module
    task.model = None

    # ---- where to start ------------------------------------------------------------------
    feeds = 0 in stages or (S - 1) in stages  # the first stage reads inputs, the last targets
    loader_workers = cfg.loader_workers if cfg.loader_workers is not None else task.loader_workers
    # the first stage's replica 0 counts each step's tokens (every replica reads the whole batch)
    counts = 0 in stages and template_rank_of(template)(0, 0) == rank
    stream = TrainStream(task, cfg.batch_size, M, device, loader_workers, load=feeds, inputs=0 in stages,
                         count_tokens=count_tokens if counts else None)
    total = total_steps(cfg, stream.steps_per_epoch)
    ckpt_layout = {**layout.describe(), "model": cfg.model, "batch_size": cfg.batch_size, "microbatches": M}
    start = 0
    if cfg.resume:
        found, state = checkpoint.agree(cfg.checkpoint_dir, ckpt_layout, cfg.resume_at_most, rank, world, control)
        if found is not None:
            for s, st in stages.items():
                st.module.load_state_dict(state["stages"][s]["module"])
                st.optimizer.load_state_dict(state["stages"][s]["optimizer"])
                st.versions.reset(0)
            checkpoint.restore_rng(state, device)
            start = found

    heartbeat = Heartbeat(env.heartbeat, rank)
    tied_grads.attach(stages, heartbeat)
    dist.barrier(group=control)
    origin = env.origin if env.origin is not None else time.perf_counter()
    recorder = Recorder(origin, cfg.instrument, device=device)
    mode = "gloo" if device.type == "cuda" and not shared else p2p_mode(cfg.p2p)
    rank_of = template_rank_of(template)
    pairs = _transfer_pairs(template, rank_of, S)
    staged, nccl_group, window = frozenset(), None, lookahead_for(dist.get_backend())
    if shared:  # same-GPU peers through host memory; the others over an NCCL group (every rank makes it)
        staged = frozenset(r for r in range(world) if r != rank and env.gpus[r] == env.gpus[rank])
        if any(pair_transport(env.gpus, a, b) == "nccl" for a, b in pairs):
            nccl_group = dist.new_group(backend="nccl", timeout=timeout)
        window = run_lookahead(env.gpus, pairs)
        pairs = {(a, b) for a, b in pairs if pair_transport(env.gpus, a, b) == "host"}
    # Enough slots that a sender rarely waits: two batches' microbatches, at most 256 MiB a channel.
    out, inc = open_channels(mode, rank, world, pairs, specs, max(8, 2 * M), env.shm_prefix, cfg.hang_timeout_s + 60)
    p2p = P2P(specs, device, out, inc, staged, nccl_group)
    # NCCL pairs transfers in issue order, whatever the tags: no receive may run ahead where any
    # pair goes over NCCL (posting.py)
    executor = Executor(rank, stages, S, p2p, rank_of, groups, recorder, heartbeat, window=window)
    last_stage = stages.get(S - 1)
    is_reporter = last_stage is not None and rank_of(S - 1, 0) == rank
    # beat before saying ready: the launcher starts watching for silence once every worker is
    # ready, and a heartbeat still at 0 would read as silent since the machine started
    heartbeat.beat()
    env.channel.put(("ready", rank, list(me.stages), me.replica, os.getpid(), start, total, stream.steps_per_epoch,
                     cpu_matmul.active() if device.type == "cpu" else None, node_name()))

    reports = StepReports(env.channel, rank)

    fault = InjectedFault.of(cfg.fail_at, rank, device)

    def on_step_done(k: int) -> None:
        failing = fault is not None and fault.due(k)
        reports.step_done(k, recorder, last_stage, now=failing, tokens=stream.take_tokens(k))
        if failing:  # its report is out first: the failure's window is recorded
            fault.fire()

    freeze_heap()
    # ---- the training loop ------------------------------------------------------------------
    step, metric, stop = start, None, False
    replica0 = template_rank_of(template)
    evaluates = task.val_data is not None and (cfg.target is not None or cfg.eval_at_end)
    val = ValStream(task, cfg.microbatch_size, device,
                    load=any(s in stages and replica0(s, 0) == rank for s in (0, S - 1)),
                    inputs=0 in stages) if evaluates else None
    for seg_end in segment_ends(cfg, start, total, stream.steps_per_epoch):
        if cfg.is_async:  # one pipedream schedule per segment, drained at its end
            n = (seg_end - step) * M
            actions = layout.build(n).actions[rank]
            base = step
            executor.run(actions, lambda mb, b=base: _data(stream, stages, S, b * M + mb),
                         step_of=lambda mb, b=base: b + mb // M, on_step_done=on_step_done,
                         event_mb=lambda mb, b=base: b * M + mb)
            for st in stages.values():
                st.versions.reset(0)
        else:
            actions = template.actions[rank]
            sync = _ddp_sync(actions) if data_parallel else None
            for k in range(step, seg_end):
                executor.run(actions, lambda mb, k=k: _data(stream, stages, S, k * M + mb),
                             step_of=lambda mb, k=k: k, on_step_done=on_step_done, ddp_sync=sync,
                             event_mb=lambda mb, k=k: k * M + mb)
        step = seg_end
        reports.flush()  # what evaluation, checkpoints and the end report follows every step's report
        due_eval = val is not None and ((cfg.target is not None and _due(step, cfg.eval_every or stream.steps_per_epoch))
                                        or step == total)
        due_checkpoint = bool(cfg.checkpoint_dir) and (_due(step, cfg.checkpoint_every) or step == total)
        if is_reporter and (due_eval or due_checkpoint) and step < total:
            # the time until the next step is a pause, not a step's (pipeboard.trainer.schedule.measured)
            env.channel.put(("pause", rank, step))
        if due_eval:
            metric = _evaluate(cfg, task, executor, stages, template, rank, S, val)
            stop = cfg.target is not None and metric is not None and task.reached(metric, cfg.target)
            env.channel.put(("eval", rank, step, recorder.now(), metric)) if is_reporter else None
            flags = torch.tensor([0.0 if metric is None else metric, float(stop)], dtype=torch.float64)
            with blocked(heartbeat):
                dist.broadcast(flags, src=rank_of(S - 1, 0), group=control)
            metric, stop = float(flags[0]), bool(flags[1])
        if due_checkpoint or (cfg.checkpoint_dir and stop):  # stop: the evaluation just reached the target
            state = {"step": step, **checkpoint.rng_state(device),
                     "stages": {s: {"module": st.module.state_dict(), "optimizer": st.optimizer.state_dict()}
                                for s, st in stages.items()}}
            checkpoint.save_rank(cfg.checkpoint_dir, step, rank, state)
            with blocked(heartbeat):
                dist.barrier(group=control)
            if int(os.environ.get("LOCAL_RANK", rank)) == 0:  # each host's first: its folder has its ranks' files
                checkpoint.mark_complete(cfg.checkpoint_dir, step, ckpt_layout, cfg.checkpoint_keep)
        if stop:
            break
    env.channel.put(("finished", rank, step, recorder.now(), metric,
                     cpu_matmul.calls if cpu_matmul.active() == "onednn" else None))
    with blocked(heartbeat):
        dist.barrier(group=control)


def freeze_heap() -> None:
    """Collect what setting up left, then move every object alive into the collector's permanent
    generation: training's collections then walk only what training allocates. Without it, a
    collection that walks the imported modules and the model stalls every stage mid-step, at the
    same step of every run (docs/runtime.md, "Garbage collection", has the figures). Forked from
    a launcher that froze its own objects, the collection here walks only the worker's; a spawned
    worker's walks everything once, before training."""
    gc.collect()
    gc.freeze()


@contextmanager
def blocked(heartbeat: Heartbeat):
    """Mark this worker as waiting on its peers (not hung) while in a collective."""
    heartbeat.waiting(True)
    try:
        yield
    finally:
        heartbeat.waiting(False)


def threads_per_worker(world: int) -> int:
    """Share this machine's usable cores among the workers on it (2 cores, 2 stages: 1 each), so
    stage processes do not oversubscribe the cores and slow each other down."""
    from pipeboard.trainer.hostinfo import usable_cores

    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return max(1, usable_cores() // max(1, local))


def _transfer_pairs(template, rank_of, S: int) -> set[tuple[int, int]]:
    """Every directed (sender, receiver) rank pair of training and of evaluation (replica 0 of
    each stage in a chain), the same on every rank."""
    pairs = {(r, a.peer) for r, acts in enumerate(template.actions) for a in acts
             if a.kind in (Kind.SEND_ACT, Kind.SEND_GRAD) and a.peer is not None}
    pairs |= {(rank_of(s, 0), rank_of(s + 1, 0)) for s in range(S - 1)}
    return pairs


def template_rank_of(template):
    ranks = {}
    for w in template.workers:
        for s in w.stages:
            ranks.setdefault(s, []).append(w.rank)

    def rank_of(stage: int, mb: int) -> int:
        r = ranks[stage]
        return r[mb % len(r)]

    return rank_of


def _data(stream: TrainStream, stages: dict[int, Stage], S: int, g: int):
    if 0 in stages or (S - 1) in stages:
        x, y = stream.microbatch(g)
        return x, y
    return None, None


def _due(step: int, every: int | None) -> bool:
    return bool(every) and step % every == 0


def _ddp_sync(actions) -> set[int]:
    """dp: only the last microbatch before each all-reduce lets DistributedDataParallel reduce."""
    sync, last_b = set(), None
    for a in actions:
        if a.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
            last_b = a.microbatch
        elif a.kind in (Kind.ALLREDUCE, Kind.STEP) and last_b is not None:
            sync.add(last_b)
            last_b = None
    return sync


def _evaluate(cfg, task, executor, stages, template, rank, S, val) -> float | None:
    """Forward the validation split through replica 0 of every stage; the last stage scores it."""
    replica0 = {s: template_rank_of(template)(s, 0) for s in range(S)}
    actions = eval_actions(S, replica0, rank, len(val))
    for st in stages.values():
        st.module.eval()
        st.eval_outputs = []
    executor.run(actions, lambda j: val.microbatch(j), step_of=lambda j: 0, train=False,
                 rank_of=lambda s, mb: replica0[s], record=False)
    for st in stages.values():
        st.module.train()
    last = stages.get(S - 1)
    if last is None or replica0[S - 1] != rank:
        return None
    # padded to the longest where lengths differ, targets with the ignored index: a per-token mean
    outputs = join(last.eval_outputs)[: val.count]
    targets = join_targets([val.microbatch(j)[1] for j in range(len(val))])[: val.count]
    last.eval_outputs = []
    return float(task.metric_fn(outputs.float().cpu(), targets.cpu()))
