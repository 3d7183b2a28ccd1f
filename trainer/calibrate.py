"""A calibrated profile: the layers measured as a run will run them, and the machine's figures the
run's prediction needs beyond them (trainer.schedule.predict), in one profile.

``calibrated_profile`` is what a job's profiling phase measures (the service runs it in a child,
``python -m pipeboard.app.services.profile_run``) and what ``pipeboard profile --calibrate``
measures in its own process, so a profile made either way carries the same figures:

- ``weight_batch_size``: what each layer costs in the runtime's batched weight gradients (W(-1))
  over a batch of that many samples (``weight_batched_ms``). The runtime computes a plain
  nn.Linear's in one matmul over the whole batch, far cheaper than one per microbatch: the model
  is profiled again at that batch and the Linear's weight-gradient part kept; other layers' it
  computes a microbatch at a time: that many microbatches times their part;
- ``calibrate``: the link between two worker processes and the runtime's per-action overhead
  (trainer.runtime.machine, kept for a while in ``machine_cache``); with ``run_batch_size``,
  what loading a batch of that many samples costs the first and last stage per step; with
  ``pilot_workers`` and ``pilot_microbatches`` (CPU), the pilot runs (trainer.runtime.pilot):
  the runtime trains the model a few steps as a pipeline and as a replicated stage, and what its
  actions took beyond the profile's prediction is kept;
- ``concurrent``: that many processes train the model on the profiled microbatch meanwhile, as a
  run's other workers do on the other cores.

A task whose batches vary in length (``Task.varying_dims``: text padded per batch) is measured at
the lengths its data has (``trainer.profile.at_lengths.profile_at_lengths`` over the run's first
batches, ``length_batches``): the profile's layers hold the expected costs over the batches'
length histogram and its ``lengths`` the costs at each measured length, which the plan and the
prediction read (docs/variable-shapes.md).

It lives beside the planner's choice (trainer/choose.py), not in trainer.profile, because it
runs the runtime (trainer.profile never imports it).
"""

from __future__ import annotations

from typing import Any


def load_task(source: str, model_args: dict[str, Any], batch_size: int, data: str | None = None):
    """The checked task of a zoo name or a task factory (`pkg.mod:function`, `file.py:function`)."""
    from pipeboard.trainer.spec import load_task as load
    from pipeboard.trainer.task import check_task

    task = load(source, model_args, data)
    check_task(task, batch_size)
    return task


def batched_by_runtime(desc: str) -> bool:
    """Whether the runtime's W(-1) computes this layer's weight gradients in one matmul over all
    the microbatches (trainer.runtime.weightgrad: plain nn.Linear; its repr starts so)."""
    return desc.startswith("Linear(")


def calibrated_profile(source: str, model_args: dict[str, Any], batch_size: int, device: str = "cpu",
                       repeats: int = 5, *, optimizer: str | None = None, weight_batch_size: int | None = None,
                       calibrate: bool = False, data: str | None = None, concurrent: int = 0,
                       run_batch_size: int | None = None, machine_cache: str | None = None,
                       machine_max_age_s: float = 0.0, pilot_workers: int | None = None,
                       pilot_microbatches: int | None = None, threads: int | None = None, warmup: int = 2,
                       task: Any = None, progress=None, precision: str = "fp32") -> Any:
    """The Profile of the model at ``batch_size`` with what the module docstring lists. ``task``:
    the loaded task (else loaded from ``source``); ``progress``: profile_model's callback."""
    from pipeboard.trainer.hostinfo import usable_cores

    task = task if task is not None else load_task(source, model_args, batch_size, data)
    example = task.example_input(batch_size)
    if optimizer is None and task.optimizer_name != "custom":
        optimizer = task.optimizer_name  # what the runtime will step
    opt = optimizer or "adam"
    # the other workers' processes train on microbatches meanwhile, as in the run
    load = dict(concurrent=concurrent, load_input=example) if concurrent else {}
    extra = {"progress": progress} if progress is not None else {}
    measure = dict(device=device, warmup=warmup, repeats=repeats, optimizer=opt, layers=task.layers,
                   precision=precision, **extra, **load)
    prof = profile_task(task, batch_size, run_batch_size, **measure)
    if not prof.model:
        prof.model = source
    # the cores a local run's workers will share (more workers than cores take turns on them)
    prof.meta["cores"] = usable_cores()
    if weight_batch_size is not None:
        batched_weight_gradients(prof, task, batch_size, weight_batch_size, device=device, repeats=repeats,
                                 optimizer=opt, precision=precision, **load)
    if calibrate:
        calibrate_machine(prof, task, source, model_args, batch_size, device=device, data=data,
                          run_batch_size=run_batch_size, machine_cache=machine_cache,
                          machine_max_age_s=machine_max_age_s, pilot_workers=pilot_workers,
                          pilot_microbatches=pilot_microbatches, threads=threads, optimizer=optimizer)
    return prof


LENGTH_BATCHES = 256  # the run's first batches whose padded lengths make the profile's length histogram


def profile_task(task: Any, batch_size: int, run_batch_size: int | None = None, **measure: Any) -> Any:
    """The task's model profiled at microbatches of ``batch_size`` (``measure``: profile_model's
    options): at the lengths its data has when its batches vary in length (``length_batches``,
    ``profile_at_lengths``), else at its example input."""
    from pipeboard.trainer.profile.profiler import profile_model

    lengths = length_batches(task, batch_size, run_batch_size)
    if lengths is None:
        return profile_model(task.model, task.example_input(batch_size), batch_size=batch_size, **measure)
    from pipeboard.trainer.profile.at_lengths import profile_at_lengths

    dim, batches = lengths
    return profile_at_lengths(task.model, batches, dim, batch_size, **measure)


def length_batches(task: Any, batch_size: int, run_batch_size: int | None = None) -> tuple[int, list] | None:
    """(dimension, inputs of the run's first ``LENGTH_BATCHES`` batches in its epoch-0 order) for a
    task whose inputs vary in length from batch to batch (``Task.varying_dims``: declared
    ``dynamic_dims`` or found by collating), None for one of fixed shape. The batches are the
    run's (``run_batch_size`` samples, at least ``batch_size``), so the lengths profiled and the
    histogram the planner assumes are those of the batches the run will train on."""
    dims = task.varying_dims(batch_size)
    if not dims:
        return None
    dim = min(dims)  # a text batch's sequence dimension (the first after the samples)
    run = max(batch_size, run_batch_size or task.batch_size or batch_size)
    batches = [tuple(x) if isinstance(x, list) else x
               for (x, _), _k in zip(task.train_batches(run), range(LENGTH_BATCHES))]
    if not batches:  # fewer samples than one run batch: the profiled batch's own size
        batches = [x for (x, _), _k in zip(task.train_batches(batch_size), range(LENGTH_BATCHES))]
    return dim, batches


def batched_weight_gradients(prof: Any, task: Any, batch_size: int, weight_batch_size: int, *, device: str,
                             repeats: int, optimizer: str, precision: str = "fp32", **load: Any) -> None:
    """Sets the layers' ``weight_batched_ms`` for W(-1) over ``weight_batch_size`` samples."""
    from pipeboard.trainer.profile.profiler import profile_model

    if weight_batch_size == batch_size:  # one microbatch per batch: W(-1) is the profile's own weight part
        for layer in prof.layers:
            layer.weight_batched_ms = layer.backward_weight_ms
        prof.weight_batch_size = batch_size
        return
    big = profile_model(task.model, task.example_input(weight_batch_size), batch_size=weight_batch_size,
                        device=device, warmup=2, repeats=repeats, optimizer=optimizer, optimizer_steps=False,
                        layers=task.layers, precision=precision, **load)
    weights = {layer.name: layer.backward_weight_ms for layer in big.layers}
    per_batch = weight_batch_size / batch_size
    for layer in prof.layers:
        if batched_by_runtime(layer.desc):
            layer.weight_batched_ms = weights.get(layer.name)
        elif layer.backward_weight_ms is not None:  # the runtime's W(-1) runs these a microbatch at a time
            layer.weight_batched_ms = layer.backward_weight_ms * per_batch
    prof.weight_batch_size = weight_batch_size
    prof.meta["weight_batch_wall_s"] = big.meta.get("wall_s")


def calibrate_machine(prof: Any, task: Any, source: str, model_args: dict[str, Any], batch_size: int, *,
                      device: str = "cpu", data: str | None = None, run_batch_size: int | None = None,
                      machine_cache: str | None = None, machine_max_age_s: float = 0.0,
                      pilot_workers: int | None = None, pilot_microbatches: int | None = None,
                      threads: int | None = None, optimizer: str | None = None) -> None:
    """Sets the profile's ``link``, ``overhead`` (with the data loading, given ``run_batch_size``)
    and ``pilot`` (given the pilot's workers and microbatches, on the CPU)."""
    from pipeboard.trainer.hostinfo import usable_cores
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
