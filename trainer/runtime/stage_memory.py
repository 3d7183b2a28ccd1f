"""A run's memory per stage: what memory_model predicts for it, and an out-of-memory stage in one line.

The launcher predicts each stage's peak before any worker starts (``predict``: the run's own
stage modules measured on one microbatch, trainer/runtime/memory_predict.py, under the run's
schedule, optimizer and recompute); workers measure theirs every step (instrument.MemoryMeter);
the reporter puts both side by side in the run's summary (``memory``: one entry per stage with
``stage``, ``predicted_bytes``, ``measured_bytes``). A stage that runs out of memory fails the
run with one line (``out_of_memory_line``) rather than an allocator's paragraph: the stage, the
device, what it tried to allocate, and, added by the reporter, its predicted and measured peaks.
"""

from __future__ import annotations

import re
from typing import Any

# torch is imported where used: the reporter's half (figures, entries) is read by the API process too

OOM_PREFIX = "out of memory"  # how a worker's error message starts when it ran out (the reporter adds figures)


def fmt_bytes(n: float | int | None) -> str:
    if n is None:
        return "unknown"
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _optimizer(task, modules, lr) -> str:
    """memory_model's name for the optimizer the run's stages get (a task's callable is built once
    on a stage with parameters to see which it is)."""
    from pipeboard.trainer.runtime.memory_predict import optimizer_kind

    if isinstance(task.optimizer, str):
        return optimizer_kind(task.optimizer)
    for m in modules:
        params = list(m.parameters())
        if params:
            return optimizer_kind(task.make_optimizer(params, lr))
    return "sgd-plain"  # no parameters anywhere: no optimizer state


def _microbatches(cfg) -> int:
    """How many microbatches the predicted action list spans: one batch for a synchronous
    schedule (every batch repeats it); an asynchronous one (pipedream) runs its batches as one
    pipeline, whose first batch holds one weight version where later ones hold several, so up to
    4 batches of it (its steady state on the pipelines runs use), as many as the run has."""
    if not cfg.is_async:
        return cfg.microbatches
    return cfg.microbatches * max(1, min(cfg.steps or 4, 4))


def predict(cfg, layout, task, modules) -> tuple[dict[int, int] | None, str | None]:
    """(virtual stage -> predicted peak bytes of the worker holding it, None) or (None, why not).

    Measured on CPU modules under the run's precision, which gives the same bytes a GPU's tensors
    take (the same shapes and dtypes); what a GPU adds beyond them (the CUDA context, the caching
    allocator's rounding and its workspaces) is not predicted, and the error shows it."""
    import torch

    from pipeboard.trainer.runtime.memory_predict import measure_stages, predicted_bytes_per_stage

    try:
        example = task.example_input(cfg.microbatch_size)
        _, target = task.example_batch(cfg.microbatch_size)  # the last stage's loss is counted too
        with torch.enable_grad():  # saved tensors are packed only where autograd records
            counted = measure_stages(modules, example, cfg.precision, "cpu", loss=task.loss, target=target)
        return (predicted_bytes_per_stage(layout.build(_microbatches(cfg)), counted, _optimizer(task, modules, cfg.lr),
                                          cfg.recompute or ()), None)
    except Exception as exc:  # a model the counting cannot run: the run goes on, its summary says why
        return None, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


_TRIED = re.compile(r"(?i:tried to allocate) (\d+ bytes|[0-9.]+ ?[KMGTP]?i?B\b)")


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())


def out_of_memory_line(exc: BaseException, device) -> str:
    """One line for an allocation that failed: ``out of memory on cuda:0: tried to allocate 2.00 GiB``
    (the size as the allocator said it), then what the device had, where torch says."""
    text = str(exc)
    m = _TRIED.search(text)
    tried = m.group(1) if m else None
    if tried and tried.endswith("bytes"):
        tried = fmt_bytes(int(tried.split()[0]))
    line = f"{OOM_PREFIX} on {device if device is not None else 'its device'}: "
    line += f"tried to allocate {tried}" if tried else "an allocation failed"
    free = re.search(r"of which ([0-9.]+ ?[KMGT]?i?B) is free", text)
    if free:
        line += f" with {free.group(1)} free"
    return line


def memory_entries(stages: list[int], predicted: dict[int, int] | None, measured: dict[int, int]) -> list[dict[str, Any]]:
    """The summary's ``memory``: one entry per stage, predicted beside measured (None: not known)."""
    return [{"stage": s, "predicted_bytes": (predicted or {}).get(s), "measured_bytes": measured.get(s)} for s in stages]


def figures(stages: list[int], predicted: dict[int, int] | None, measured: dict[int, int]) -> str:
    """'predicted peak X, measured peak Y' for the stages of one worker (their worker's figures)."""
    pred = max((predicted or {}).get(s, 0) for s in stages) if predicted and stages else None
    meas = max((measured.get(s, 0) for s in stages), default=0) or None
    return f"predicted peak {fmt_bytes(pred)}, measured peak {fmt_bytes(meas)} before it"


def device_name(kind: str) -> str:
    """The device a failing worker ran on, for its error line (``cuda:N`` as this process numbers it)."""
    if kind == "cuda":
        import torch

        if torch.cuda.is_initialized():
            return f"cuda:{torch.cuda.current_device()}"
        return "cuda"
    return "cpu"


def error_message(exc: BaseException, device_kind: str) -> str:
    """A worker's one-line error: an out-of-memory stage's line, else the exception's first line."""
    if is_out_of_memory(exc):
        return out_of_memory_line(exc, device_name(device_kind))
    return f"{type(exc).__name__}: {exc}"
