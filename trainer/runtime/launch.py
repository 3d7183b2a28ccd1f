"""Start one process per stage replica, watch them, forward their reports, and clean up.

``run_training(cfg, sink)`` is the runtime's entry point. It spawns the workers with
``torch.multiprocessing``, relays their messages to the sink (``Reporter``), and watches for
failure: a worker that exits non-zero, is killed, or makes no progress for ``hang_timeout_s``
while not waiting on a peer ends the run. Every worker is then terminated (workers also die with
the launcher through PR_SET_PDEATHSIG), and ``RunFailed`` names the stage and rank at fault.

Under torchrun, ``python -m pipeboard.trainer.runtime.torchrun_entry`` runs the same worker code with the
rank and rendezvous taken from the environment.
"""

from __future__ import annotations

import gc
import os
import queue as queue_mod
import signal
import socket
import time
from typing import Any

from pipeboard.trainer import cpu_matmul
from pipeboard.trainer.runtime import gpu_share, shm, stage_memory, stage_modules, tied
from pipeboard.trainer.runtime.run_config import ConfigError, RunConfig
from pipeboard.trainer.runtime.instrument import memory_source
from pipeboard.trainer.runtime.layout import resolve
from pipeboard.trainer.runtime.report import LAST_MESSAGE_GRACE_S, Reporter
from pipeboard.trainer.runtime.worker_process import WorkerEnv, threads_per_worker, worker_main
from pipeboard.trainer.sink import NullSink, Sink
from pipeboard.trainer.task.check import check_task

FAILURE_GRACE_S = 1.0  # after a first failure, how long to collect the others' reports
COMM_ERROR_HINTS = ("connection closed", "connection reset", "broken pipe", "socket", "gloo", "timed out",
                    "timeout", "peer")


class RunFailed(RuntimeError):
    """The run ended because a worker died, raised, or hung; the message names stage and rank.
    ``lost``: a worker was killed, hung or vanished without a word (the same run again could
    succeed from a checkpoint), rather than stopped by an error it reported."""

    def __init__(self, message: str, rank: int | None = None, stages: list[int] | None = None, lost: bool = False) -> None:
        super().__init__(message)
        self.rank = rank
        self.stages = stages or []
        self.lost = lost


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_training(cfg: RunConfig, sink: Sink | None = None) -> dict[str, Any]:
    """Train as ``cfg`` says; returns (and sends to the sink) the run's summary."""
    import torch.multiprocessing as mp

    sink = sink or NullSink()
    cfg.validate()
    layout = resolve(cfg)
    # Resolve the task and its stages once, here: a bad task, bad model arguments or a plan that
    # does not fit the model fail before any process starts, and workers need not trace again.
    task = stage_modules.load_task(cfg)
    check_task(task, cfg.batch_size)
    layers = stage_modules.stage_layers(cfg, task, layout.virtual_stages)
    modules = stage_modules.build_stages(task.model, task.example_input(cfg.microbatch_size), layers, task.layers,
                                         task.varying_dims(cfg.microbatch_size))
    tied.check(cfg, layout, tied.find(modules, task.model))  # pipedream: no tie across workers
    if cfg.target is not None and task.val_data is None:
        raise ConfigError(f"target: task {cfg.model!r} has no val_data to measure a metric on")
    # the launcher's matmul setting, for every worker whatever their environment
    cfg = cfg.with_(stages=layers, num_stages=None, cpu_matmul=cpu_matmul.configured(cfg.cpu_matmul))
    layout = resolve(cfg)
    world = layout.world
    predicted = stage_memory.predict(cfg, layout, task, modules)
    gpus = gpu_devices(cfg.device, layout, predicted[0])
    # Building any torch.optim optimizer imports torch._dynamo (seconds); do it once here so
    # forked workers inherit it instead of each paying for it.
    import torch._dynamo  # noqa: F401

    ctx = mp.get_context(cfg.start_method or _start_method(cfg, world))
    channel = ctx.Queue()
    heartbeat = ctx.Array("d", 2 * world, lock=False)
    port = cfg.master_port or free_port()
    origin = time.perf_counter()
    wall0 = time.monotonic()
    sink.on_status("starting", f"{world} workers, schedule {cfg.schedule}", workers=world, **layout.describe())
    reporter = Reporter(sink, world, cfg.batch_size, task.metric_name)
    reporter.expect_memory(*predicted, memory_source(cfg.device))
    procs = []
    # Workers unlink their shared-memory channels once mapped; one killed during set-up cannot,
    # so the launcher removes whatever is left under this run's prefix on every exit.
    prefix = f"pipeboard-{os.getpid()}-{port}"
    # Forked workers inherit the launcher's objects (torch's among them) frozen: their garbage
    # collections never walk them (worker.freeze_heap). The launcher's own thaw once they started.
    forking = ctx.get_start_method() == "fork"
    if forking:
        gc.freeze()
    try:
        for rank in range(world):
            env = WorkerEnv(rank, world, f"tcp://127.0.0.1:{port}", origin, channel, heartbeat, prefix, gpus)
            # Not daemonic: a worker's DataLoader starts processes of its own, which a daemonic
            # process may not. Workers still die with the launcher (PR_SET_PDEATHSIG, _stop_all).
            p = ctx.Process(target=worker_main, args=(cfg, env), name=f"pipeboard-rank{rank}", daemon=False)
            p.start()
            procs.append(p)
    finally:
        if forking:
            gc.unfreeze()
    try:
        _watch(cfg, procs, channel, heartbeat, reporter, layout)
    except BaseException as exc:
        _stop_all(procs)
        shm.remove_prefix(prefix)
        reporter.maybe_flush(force=True)
        sink.on_status("failed", str(exc))
        raise
    _stop_all(procs)
    shm.remove_prefix(prefix)
    reporter.maybe_flush(force=True)
    target = cfg.target
    summary = reporter.summary(target, task.metric_higher_is_better, time.monotonic() - wall0)
    summary.update({"schedule": cfg.schedule, "model": cfg.model, "workers": world, "precision": cfg.precision,
                    "batch_size": cfg.batch_size, "microbatches": cfg.microbatches, **layout.describe()})
    sink.on_summary(summary)
    sink.on_status("done", summary_line(summary))
    return summary


def gpu_devices(device: str, layout, predicted: dict[int, int] | None) -> tuple[int, ...] | None:
    """Rank -> the visible GPU it runs on (None on CPU). A GPU each where there are enough;
    otherwise several stage processes share a GPU, packed by predicted memory into each GPU's
    memory as the service's placement packs them (gpu_share.assign), and a run whose stages
    cannot fit is refused in one line before any process starts. Ranks on one GPU exchange
    tensors through host memory (comm.P2P), the others over NCCL."""
    if device != "cuda":
        return None
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("device cuda: CUDA is not available on this machine")
    count, world = torch.cuda.device_count(), layout.world
    need = total = None
    if world > count and predicted is not None:
        need = gpu_share.per_process(predicted, [layout.stages_of(r) for r in range(world)])
        total = [torch.cuda.get_device_properties(i).total_memory for i in range(count)]
    try:
        return tuple(gpu_share.assign(world, count, need, total))
    except gpu_share.ShareError as exc:
        raise ConfigError(f"device cuda: {world} stage processes on {count} GPU(s): {exc}") from None


def _start_method(cfg: RunConfig, world: int) -> str:
    """fork (no re-import of torch) where it is safe, else spawn.

    CUDA cannot be forked. Nor can OpenMP once the launcher has used its thread pool (building a
    model does): a forked child that then runs OpenMP regions on more than one thread hangs in
    them. Workers running one thread each (2 workers on 2 cores) never enter one."""
    if cfg.device == "cuda" or (cfg.threads or threads_per_worker(world)) > 1:
        return "spawn"
    return "fork"


def _watch(cfg, procs, channel, heartbeat, reporter: Reporter, layout) -> None:
    world = len(procs)
    failed_at: float | None = None
    exited_at: float | None = None
    while True:
        try:
            reporter.handle(channel.get(timeout=0.05))
            while True:
                reporter.handle(channel.get_nowait())
        except queue_mod.Empty:
            pass
        except (EOFError, OSError):
            pass
        reporter.maybe_flush()  # what came before the workers fell quiet (a hang, a stop) reaches the sink too
        now = time.perf_counter()
        # One reading of the exit codes per round: a worker that exits between two readings must
        # not look alive to one test and gone to the next.
        exits = [p.exitcode for p in procs]
        dead = [r for r, code in enumerate(exits) if code not in (None, 0)]
        if failed_at is None and (dead or reporter.errors):
            failed_at = now
        hung = _hung(reporter, heartbeat, world, cfg.hang_timeout_s, now) if failed_at is None else None
        if hung is not None:
            rank, silent = hung
            raise RunFailed(f"{_who(layout, rank, procs)} made no progress for {silent:.1f} s (hung); run stopped",
                            rank, list(layout.stages_of(rank)), lost=True)
        if failed_at is not None and (now - failed_at > FAILURE_GRACE_S or all(code is not None for code in exits)):
            raise _diagnose(reporter, procs, layout)
        if all(code == 0 for code in exits):
            # A worker's last reports can land between the drain above and its exit: go round
            # until every rank's "exit", its last message, is read (all of it is in the pipe once
            # it has exited).
            exited_at = exited_at or now
            if len(reporter.ended()) == world:
                return
            if now - exited_at > LAST_MESSAGE_GRACE_S:
                if not reporter.ended():
                    raise RunFailed("workers ended without reporting", lost=True)
                return
            continue


def _hung(reporter: Reporter, heartbeat, world: int, timeout: float, now: float) -> tuple[int, float] | None:
    """A worker silent for ``timeout`` while not blocked on a peer; if every worker is blocked,
    the one blocked longest."""
    if len(reporter.workers) < world or len(reporter.finished) == world:
        return None
    silent = [(now - heartbeat[2 * r], r, heartbeat[2 * r + 1] > 0) for r in range(world) if r not in reporter.finished]
    running = [(t, r) for t, r, waiting in silent if not waiting and t > timeout]
    if running:
        t, r = max(running)
        return r, t
    if silent and all(waiting and t > timeout for t, _, waiting in silent):
        t, r, _ = max(silent)
        return r, t
    return None


def _who(layout, rank: int, procs) -> str:
    stages = layout.stages_of(rank)
    label = f"stage {stages[0]}" if len(stages) == 1 else f"stages {', '.join(map(str, stages))}"
    return f"{label} (rank {rank}, pid {procs[rank].pid})"


def _diagnose(reporter: Reporter, procs, layout) -> RunFailed:
    """Blame the root cause: a worker that died without a word, else the first error that is
    not just a peer's connection dropping, else the first error."""
    reported = {r for r, *_ in reporter.errors}
    for rank, p in enumerate(procs):
        code = p.exitcode
        if code not in (None, 0) and rank not in reported:
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            if code == -signal.SIGKILL:  # on CPU, what the kernel's out-of-memory killer does
                how += f" (out of memory? {reporter.memory_note(list(layout.stages_of(rank)))})"
            return RunFailed(f"{_who(layout, rank, procs)} {how}; run stopped", rank, list(layout.stages_of(rank)),
                             lost=code < 0)
    errors = sorted(reporter.errors, key=lambda e: any(h in e[2].lower() for h in COMM_ERROR_HINTS))
    rank, stages, message, _tb = errors[0]
    return RunFailed(f"{_who(layout, rank, procs)} failed: {message}", rank, stages)


def _stop_all(procs, grace_s: float = 3.0) -> None:
    """Terminate every worker still running, then kill any that ignore it; reap them all."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)


def summary_line(s: dict[str, Any]) -> str:
    sps = f"{s['samples_per_s']:.1f} samples/s" if s.get("samples_per_s") else "n/a samples/s"
    metric = f"{s['metric_name']} {s['final_metric']:.4g}" if s.get("final_metric") is not None else "no metric"
    ttt = ""
    if s.get("target") is not None:
        ttt = f", target reached in {s['time_to_target_s']:.1f} s" if s.get("time_to_target_s") is not None \
            else ", target not reached"
    return f"{s['steps']} steps in {s['wall_s']:.1f} s, {sps}, {metric}{ttt}"
