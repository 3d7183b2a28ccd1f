"""Profile one model and write the profile JSON: `python -m pipeboard.app.services.profile_run ...`.

Jobs run this as a child process in the run's own process group (like `pipeboard train`), so
cancelling a job mid-profile ends it too, and torch never loads into the Celery worker.

Besides the per-layer profile at ``--batch-size`` (a job's microbatch size), it calibrates what
the service's predicted timeline needs beyond that (``pipeboard.trainer.schedule.predict``), stored in the
same profile JSON:

- ``--weight-batch-size N``: what each layer costs in the runtime's batched weight gradients
  (W(-1)) over a batch of N samples, as ``weight_batched_ms`` (``weight_batch_size`` = N). The
  runtime computes a plain nn.Linear's in one matmul over all N rows, which costs far less than
  M per-microbatch ones: the model is profiled again at N samples and the layer's weight-gradient
  part at N kept; other layers' it computes one microbatch at a time: M times their part at the
  microbatch size;
- ``--calibrate``: the link between two worker processes (``pipeboard.trainer.runtime.links.measure_link``)
  and the runtime's per-action overhead (``pipeboard.trainer.runtime.overhead.calibrate``: in the
  actions, and outside them, the executor's walk and its per-step set-up and report), a few
  seconds; with ``--run-batch-size N``, also what loading a batch of N samples from the task's
  data costs the first and the last stage per step;
- ``--concurrent K``: K processes train the model on the profiled microbatch meanwhile, as a
  run's other workers do on the other cores (shared caches and memory bandwidth slow each
  layer; ``pipeboard.trainer.profile.conditions.ConcurrentLoad``);
- ``--pilot-workers W --pilot-microbatches M`` (with ``--calibrate`` and ``--run-batch-size``):
  the pilot runs (``pipeboard.trainer.runtime.pilot``): the runtime itself trains the model a few
  steps as a pipeline and as a replicated stage, and what its actions took beyond the profile's
  prediction is kept (``pilot``), a few seconds more.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def load_task(source: str, model_args: dict[str, Any], batch_size: int, data: str | None = None):
    """The checked task of a zoo name or a task factory (`pkg.mod:function`, `file.py:function`)."""
    from pipeboard.trainer.spec import load_task as load
    from pipeboard.trainer.task import check_task

    task = load(source, model_args, data)
    check_task(task, batch_size)
    return task


def _batched_by_runtime(desc: str) -> bool:
    """Whether the runtime's W(-1) computes this layer's weight gradients in one matmul over all
    the microbatches (pipeboard.trainer.runtime.weightgrad: plain nn.Linear; its repr starts so)."""
    return desc.startswith("Linear(")


def profile(source: str, model_args: dict[str, Any], batch_size: int, device: str = "cpu", repeats: int = 5,
            *, optimizer: str | None = None, weight_batch_size: int | None = None,
            calibrate: bool = False, data: str | None = None, concurrent: int = 0,
            run_batch_size: int | None = None, machine_cache: str | None = None,
            machine_max_age_s: float = 0.0, pilot_workers: int | None = None,
            pilot_microbatches: int | None = None, threads: int | None = None) -> dict[str, Any]:
    """The profile JSON of the model at ``batch_size``; see the module docstring for
    ``weight_batch_size``, ``calibrate``, ``concurrent`` and ``run_batch_size``."""
    from pipeboard.trainer.hostinfo import usable_cores
    from pipeboard.trainer.profile.profiler import profile_model

    task = load_task(source, model_args, batch_size, data)
    model, example = task.model, task.example_input(batch_size)
    if optimizer is None and task.optimizer_name != "custom":
        optimizer = task.optimizer_name  # what the runtime will step
    opt = optimizer or "adam"
    # the other workers' processes train on microbatches meanwhile, as in the run
    load = dict(concurrent=concurrent, load_input=example) if concurrent else {}
    prof = profile_model(model, example, batch_size=batch_size, device=device, warmup=2, repeats=repeats, optimizer=opt,
                         layers=task.layers, **load)
    if not prof.model:
        prof.model = source
    # the cores a local run's workers will share (more workers than cores take turns on them)
    prof.meta["cores"] = usable_cores()
    if weight_batch_size is not None and weight_batch_size != batch_size:
        big_example = task.example_input(weight_batch_size)
        big = profile_model(model, big_example, batch_size=weight_batch_size, device=device, warmup=2,
                            repeats=repeats, optimizer=opt, optimizer_steps=False, layers=task.layers, **load)
        weights = {layer.name: layer.backward_weight_ms for layer in big.layers}
        per_batch = weight_batch_size / batch_size
        for layer in prof.layers:
            if _batched_by_runtime(layer.desc):
                layer.weight_batched_ms = weights.get(layer.name)
            elif layer.backward_weight_ms is not None:
                # the runtime's W(-1) runs these one microbatch at a time
                layer.weight_batched_ms = layer.backward_weight_ms * per_batch
        prof.weight_batch_size = weight_batch_size
        prof.meta["weight_batch_wall_s"] = big.meta.get("wall_s")
    elif weight_batch_size == batch_size:  # one microbatch per batch: W(-1) is the profile's own weight part
        for layer in prof.layers:
            layer.weight_batched_ms = layer.backward_weight_ms
        prof.weight_batch_size = batch_size
    if calibrate:
        from pipeboard.trainer.runtime import machine

        # the machine's figures, kept for a while (trainer/runtime/machine.py); the model's, below
        prof.link, prof.overhead, prof.meta["machine_calibration"] = machine.calibration(machine_cache, machine_max_age_s,
                                                                                         device=device)
        if run_batch_size is not None and run_batch_size >= batch_size:
            from pipeboard.trainer.runtime.overhead import measure_data_load

            first, last = measure_data_load(task, run_batch_size, max(1, run_batch_size // batch_size))
            prof.overhead.load_first_ms, prof.overhead.load_last_ms = first * 1e3, last * 1e3
        if pilot_workers and pilot_microbatches and run_batch_size and device == "cpu":
            from pipeboard.trainer.runtime import pilot

            prof.pilot = pilot.measure(prof, source, model_args, batch_size=run_batch_size,
                                       microbatches=pilot_microbatches, workers=pilot_workers, cores=usable_cores(),
                                       data=data, threads=threads, optimizer=optimizer)
    return prof.to_dict()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeboard.app.services.profile_run")
    parser.add_argument("--source", required=True)
    parser.add_argument("--model-args", default="{}", help="JSON object")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads, as each of the run's workers will have (default: torch's)")
    parser.add_argument("--optimizer", default=None, help="optimizer the run steps (default: the zoo entry's, else adam)")
    parser.add_argument("--weight-batch-size", type=int, default=None,
                        help="also time each layer's weight gradients at this many samples (batched W(-1))")
    parser.add_argument("--calibrate", action="store_true",
                        help="also measure the link between two processes and the runtime's per-action overhead")
    parser.add_argument("--concurrent", type=int, default=0,
                        help="processes training the model on the profiled batch meanwhile (a run's other workers)")
    parser.add_argument("--run-batch-size", type=int, default=None,
                        help="with --calibrate: the run's batch (samples per step); time loading it from the task's data")
    parser.add_argument("--pilot-workers", type=int, default=None,
                        help="with --calibrate and --run-batch-size: pilot runs for this many local workers")
    parser.add_argument("--pilot-microbatches", type=int, default=None,
                        help="with --pilot-workers: microbatches per step of the pilot runs (the run's)")
    parser.add_argument("--data", default=None, help="data location, passed to the task factory as data=")
    parser.add_argument("--machine-cache", default=None,
                        help="with --calibrate: folder keeping this machine's link and overhead figures")
    parser.add_argument("--machine-max-age", type=float, default=0.0,
                        help="with --machine-cache: seconds kept figures are used (0: measure them now)")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)
    # As `pipeboard train` runs (trainer/allocator.py); before torch loads, which happens below.
    from pipeboard.trainer.allocator import prefer_huge_pages

    prefer_huge_pages()
    # The kernels the job's runs will multiply with (the same variable reaches `pipeboard train`).
    from pipeboard.trainer import cpu_matmul

    try:
        cpu_matmul.use(None)  # $PIPEBOARD_CPU_MATMUL
    except (ValueError, RuntimeError) as exc:
        print(f"profiling {args.source} failed: {exc}", file=sys.stderr)
        return 1
    if args.threads:
        # A small layer's step on a thread pool whose other core is busy waits for it (an Adam step
        # of 8k parameters: 8 ms on 2 threads, 0.15 ms on 1): time what the workers will run.
        import torch

        torch.set_num_threads(args.threads)
    try:
        data = profile(args.source, json.loads(args.model_args), args.batch_size, args.device, args.repeats,
                       optimizer=args.optimizer, weight_batch_size=args.weight_batch_size, calibrate=args.calibrate,
                       data=args.data, concurrent=args.concurrent, run_batch_size=args.run_batch_size,
                       machine_cache=args.machine_cache, machine_max_age_s=args.machine_max_age,
                       pilot_workers=args.pilot_workers, pilot_microbatches=args.pilot_microbatches,
                       threads=args.threads)
    except Exception as exc:  # one line for the job's error, not a traceback
        print(f"profiling {args.source} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    with open(args.output, "w") as fh:
        json.dump(data, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
