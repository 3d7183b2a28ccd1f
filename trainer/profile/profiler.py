"""Measure a model layer by layer: forward and backward time, activation, parameter and
optimizer-state bytes, the numbers the planner divides among stages.

Layers are timed in place, inside whole training steps of the captured model (as PipeDream's
profiler does with module hooks), because a layer timed alone runs with hot caches and an idle
allocator and comes out faster than it is inside the model. Forward: the layer graph
(``outline.py``: one GraphModule per layer) runs node by node and each node's time is charged to
its layer (a helper node to the first layer that needs it). Backward: a gradient hook on every layer output marks when autograd reaches that
layer; the time until the next mark is that layer's backward (its grad functions and the
accumulation of its parameters' gradients). Times are the median over ``repeats`` steps after
``warmup`` steps, with the interquartile range as the spread. CPU marks are
``time.thread_time`` (one torch thread) or ``time.perf_counter``, CUDA marks are CUDA events on
the current stream.

Gradients accumulate by default (``accumulate=True``): every measured backward adds into
gradients that already exist, as microbatches 2..M of a pipeline step do. (Starting each step
without gradients instead times the allocation of fresh gradient buffers, whose page faults come
and go with the allocator's history; docs/profile-format.md has the figures.)
With ``split_backward`` further instrumented steps run with the parameters frozen and the
model inputs requiring gradients: autograd then computes input gradients only, and each layer's
time is its ``backward_input_ms`` (zero for a layer fed only by model inputs: the first stage
computes no input gradient). A layer output that would then need no gradient (computed from
integer inputs alone, e.g. a token embedding's) is made a leaf that does, so the chain above it
is timed as the runtime's BI runs it (it carries the gradient down to every parameterised
layer's output); without it a language model's input-gradient backward would read 0 in every
layer. ``optimizer_ms`` and the ``concurrent`` load: see conditions.py.

Self-check: the sum of all per-layer medians is compared with a measured whole training step
(forward and backward of the unsplit model) and the ratio is stored in ``profile.meta``.

The timed steps and their clock are in ``timed_steps.py``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch
from torch import nn

from pipeboard.trainer import cpu_matmul
from pipeboard.trainer.allocator import keep_freed_memory, settings as allocator_settings
from pipeboard.trainer.precision import autocast, check as check_precision
from pipeboard.trainer.profile.conditions import ConcurrentLoad, optimizer_ms
from pipeboard.trainer.profile.capture import CAPTURE_VERSION, as_tuple
from pipeboard.trainer.profile.layergraph import LayerGraph, LayerNode, flat_tensors
from pipeboard.trainer.profile.outline import capture_layers
from pipeboard.trainer.profile.schema import Layer, Profile
from pipeboard.trainer.profile.saved_bytes import LayerBytes, layer_bytes
from pipeboard.trainer.profile.timed_steps import TIMERS, Clock, measure, owners, synced_now, zero_grads

# Optimizer-state bytes per parameter byte: Adam keeps two moments, SGD with momentum one buffer.
OPTIMIZER_STATE_FACTOR = {"adam": 2.0, "adamw": 2.0, "sgd": 1.0, "sgd-nomomentum": 0.0}

# Where the self-check ratio should fall when per-layer times account for the whole step.
SELF_CHECK_BAND = (0.85, 1.15)

Progress = Callable[[int, int, str], None]  # (steps done, steps total, what runs now)


def _stats(samples: Sequence[float]) -> tuple[float, float]:
    """(median, interquartile range) of the samples."""
    if not samples:
        return 0.0, 0.0
    if len(samples) < 4:
        return float(statistics.median(samples)), float(max(samples) - min(samples))
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return float(statistics.median(samples)), float(q3 - q1)


def _tensor_bytes(t: torch.Tensor) -> float:
    return float(t.numel() * t.element_size())


def _activation_bytes(value: Any) -> float | list[float]:
    if isinstance(value, torch.Tensor):
        return _tensor_bytes(value)
    return [_tensor_bytes(t) for t in flat_tensors(value)]


def _layer_parameters(lg: LayerGraph, layer: LayerNode) -> list[torch.Tensor]:
    """Every parameter this layer (or a helper it recomputes) uses, shared ones included."""
    params: list[torch.Tensor] = []
    for node in [*layer.helpers, layer.node]:
        if node.op == "call_module":
            params += list(lg.gm.get_submodule(str(node.target)).parameters())
        elif node.op == "get_attr":
            attr = lg.gm
            for part in str(node.target).split("."):
                attr = getattr(attr, part)
            if isinstance(attr, nn.Parameter):
                params.append(attr)
    return params


def _own_parameters(lg: LayerGraph, layer: LayerNode, seen: set[int]) -> list[torch.Tensor]:
    """The parameters this layer uses, each counted once in the whole profile (a shared module is
    charged to its first layer)."""
    own: list[torch.Tensor] = []
    for p in _layer_parameters(lg, layer):
        if id(p) not in seen:
            seen.add(id(p))
            own.append(p)
    return own


def tied_layers(lg: LayerGraph) -> list[list[str]]:
    """Groups of layers that use one trained parameter (tied weights, e.g. an embedding and the
    output head): the planner and tuner keep a group on one worker for schedules that cannot keep
    copies on several in step (pipedream; ``runtime.tied.check``)."""
    users: dict[int, list[str]] = {}
    for layer in lg.layers:
        if layer.kind == "layer":
            for p in _layer_parameters(lg, layer):
                if p.requires_grad:
                    names = users.setdefault(id(p), [])
                    if layer.name not in names:
                        names.append(layer.name)
    return sorted({tuple(names) for names in users.values() if len(names) > 1}, key=lambda g: g)


def _fed_by_inputs_only(lg: LayerGraph) -> set[str]:
    """Layers all of whose data comes straight from model inputs (no input gradient to compute)."""
    inputs = set(lg.input_names())
    preds: dict[str, set[str]] = {}
    for a, b in lg.edges():
        preds.setdefault(b, set()).add(a)
    return {name for name, ps in preds.items() if ps <= inputs}


def profile_model(
    model: nn.Module,
    example_input: Any,
    *,
    batch_size: int | None = None,
    device: str = "cpu",
    warmup: int = 3,
    repeats: int = 10,
    progress: Progress | None = None,
    optimizer: str = "adam",
    model_name: str = "",
    timer: str = "auto",
    accumulate: bool = True,
    split_backward: bool = True,
    optimizer_steps: bool = True,
    concurrent: int = 0,
    load_input: Any = None,
    precision: str = "fp32",
    layers: Sequence[str] | None = None,
) -> Profile:
    """Profile ``model`` on ``example_input`` (a tensor or a tuple of tensors).

    The model and input are moved to ``device`` and the model is put in training mode.
    ``batch_size`` defaults to the first input's leading dimension. ``optimizer`` sets the
    optimizer-state bytes (see ``OPTIMIZER_STATE_FACTOR``). ``timer`` picks the CPU clock (see
    ``timed_steps.Clock``): ``auto``, ``wall`` or ``cpu``; CUDA always uses CUDA events. ``accumulate``:
    backwards add into existing gradients (see the module docstring). ``split_backward``: also
    measure each layer's ``backward_input_ms``. ``optimizer_steps``: measure each layer's
    ``optimizer_ms``. ``concurrent``: processes training the same model meanwhile (CPU only;
    e.g. stages - 1 for a pipeline with one stage per core). ``load_input``: what those processes
    train on, by default ``example_input``; give it what the other stages run while this
    measurement's work runs in the pipeline: a whole batch profiled for batched weight gradients
    (one W per update, at the batch size) is measured under a load of microbatches, since the
    other stage is busy with microbatches while W runs (docs/profile-format.md, ``concurrent``,
    has the figures).

    The process is switched to the runtime workers' heap setting first (freed memory is kept:
    ``pipeboard.trainer.allocator.keep_freed_memory``), so that backwards are not timed with page faults a
    run does not have; huge pages must be asked for before torch loads (the ``pipeboard`` commands
    do). ``meta["allocator"]`` records both. ``precision``: the arithmetic the runs will train in
    (``pipeboard.trainer.precision``): bf16 forwards run under autocast, so times and activation bytes are
    bf16's; ``meta["precision"]`` records it. ``layers``: the granularity's module paths (the
    task's ``layers``; default: ``pipeboard.trainer.profile.granularity``); ``meta["capture"]`` names
    the capture that made the layers.
    """
    check_precision(precision)
    if warmup < 0 or repeats < 1:
        raise ValueError("warmup must be >= 0 and repeats >= 1")
    if optimizer not in OPTIMIZER_STATE_FACTOR:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATE_FACTOR)}, got {optimizer!r}")
    if timer not in TIMERS:
        raise ValueError(f"timer must be one of {TIMERS}, got {timer!r}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but CUDA is not available on this machine")
    if concurrent < 0 or (concurrent and dev.type != "cpu"):
        raise ValueError(f"concurrent must be >= 0, and 0 on {dev.type}; got {concurrent}")
    keep_freed_memory()  # before the concurrent load forks: it inherits the setting
    started = time.perf_counter()
    model = model.to(dev).train()
    inputs = tuple(t.to(dev) for t in as_tuple(example_input))
    if batch_size is None:
        batch_size = _leading_size(inputs)
    with autocast(dev.type, precision):  # the example values, hence activation bytes, in its dtypes
        lg = capture_layers(model, inputs, layers)
    clock = Clock(dev, timer)
    owner = owners(lg)
    params = list(model.parameters())
    steps = warmup + repeats
    load = inputs if load_input is None else tuple(t.to(dev) for t in as_tuple(load_input))
    with ConcurrentLoad(model, load, concurrent, precision):
        fwd_samples, bwd_samples, bi_samples, step_f, step_b, instrumented = measure(
            lg, model, owner, clock, inputs, params, warmup, repeats, accumulate, split_backward, progress, precision)
        seen_params: set[int] = set()
        own = {layer.name: _own_parameters(lg, layer, seen_params) for layer in lg.layers if layer.kind == "layer"}
        step_now = clock._now if not clock.cuda else synced_now
        opt_ms = optimizer_ms(own, optimizer, repeats, step_now) if optimizer_steps else {}
    held = layer_bytes(lg, owner, inputs, params, dev.type, precision)
    zero_grads(params)
    if progress:
        progress(steps, steps, "done")
    input_fed = _fed_by_inputs_only(lg)

    entries: list[Layer] = []
    for layer in lg.layers:
        kept = held.get(layer.name, LayerBytes(0, 0, 0))
        entry = Layer(name=layer.name, desc=layer.desc, activation_bytes=_activation_bytes(lg.values[layer.name]),
                      saved_bytes=float(kept.saved), weight_grad_bytes=float(kept.weight_grad),
                      weight_input_bytes=float(kept.weight_input))
        if layer.kind == "layer":
            entry.forward_ms, entry.forward_spread_ms = _stats(fwd_samples[layer.name])
            entry.backward_ms, entry.backward_spread_ms = _stats(bwd_samples[layer.name])
            entry.parameter_bytes = sum(_tensor_bytes(p) for p in own[layer.name])
            entry.optimizer_bytes = entry.parameter_bytes * OPTIMIZER_STATE_FACTOR[optimizer]
            if split_backward:
                bi = 0.0 if layer.name in input_fed else _stats(bi_samples[layer.name])[0]
                entry.backward_input_ms = min(bi, entry.backward_ms)
            if optimizer_steps:
                entry.optimizer_ms = opt_ms[layer.name]
        entries.append(entry)
    step_total = [f + b for f, b in zip(step_f, step_b)]
    step_ms, step_spread = _stats(step_total)
    layer_sum = sum(layer.compute_ms for layer in entries)
    meta = {
        "source": "profiler",
        "timer": clock.kind,
        "warmup": warmup,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "optimizer": optimizer,
        "capture": CAPTURE_VERSION,
        "inputs": lg.input_names(),
        "tied": [list(group) for group in tied_layers(lg)],
        "outputs": lg.outputs,
        "layer_sum_ms": layer_sum,
        "step_ms": step_ms,
        "step_spread_ms": step_spread,
        "step_forward_ms": _stats(step_f)[0],
        "step_backward_ms": _stats(step_b)[0],
        "self_check_ratio": layer_sum / step_ms if step_ms > 0 else None,
        # median over steps of the per-layer times summed within a step: the instrumented step
        "step_instrumented_ms": _stats(instrumented)[0],
        "wall_s": time.perf_counter() - started,
        "gradients": "accumulate" if accumulate else "fresh",
        "concurrent": concurrent,
        "load_batch_size": _leading_size(load) if concurrent else None,
        "allocator": allocator_settings(),
        "precision": precision,
        "cpu_matmul": cpu_matmul.active() if dev.type == "cpu" else None,
        "optimizer_step_ms": sum(opt_ms.values()) if optimizer_steps else None,
    }
    return Profile(layers=entries, edges=lg.edges(), model=model_name or type(model).__name__,
                   batch_size=batch_size, device=str(dev), meta=meta)


def _leading_size(inputs: tuple) -> int:
    """The batch size of model inputs: the first tensor's leading dimension (1 for a scalar)."""
    return int(inputs[0].shape[0]) if inputs[0].dim() else 1



def self_check_line(profile: Profile) -> str:
    """The one-line self-check the CLI prints with every profile."""
    m = profile.meta
    ratio = m.get("self_check_ratio")
    ratio_s = f"{ratio:.3f}" if isinstance(ratio, (int, float)) else "n/a"
    line = (f"self-check: sum of per-layer forward+backward {m.get('layer_sum_ms', 0.0):.3f} ms vs measured "
            f"whole step {m.get('step_ms', 0.0):.3f} ms: ratio {ratio_s}")
    if isinstance(ratio, (int, float)) and not SELF_CHECK_BAND[0] <= ratio <= SELF_CHECK_BAND[1]:
        line += (f" (outside {SELF_CHECK_BAND[0]}..{SELF_CHECK_BAND[1]}: noisy timings, or a busy machine "
                 f"with the wall clock; try more --repeats or --threads 1)")
    return line
