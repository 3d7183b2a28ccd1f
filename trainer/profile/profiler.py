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
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch
from torch import fx, nn

from pipeboard.trainer import cpu_matmul
from pipeboard.trainer.allocator import keep_freed_memory, settings as allocator_settings
from pipeboard.trainer.precision import autocast, check as check_precision
from pipeboard.trainer.profile.conditions import ConcurrentLoad, optimizer_ms
from pipeboard.trainer.profile.capture import CAPTURE_VERSION, as_tuple
from pipeboard.trainer.profile.layergraph import LayerGraph, LayerNode, flat_tensors
from pipeboard.trainer.profile.outline import capture_layers
from pipeboard.trainer.profile.schema import Layer, Profile

# Optimizer-state bytes per parameter byte: Adam keeps two moments, SGD with momentum one buffer.
OPTIMIZER_STATE_FACTOR = {"adam": 2.0, "adamw": 2.0, "sgd": 1.0, "sgd-nomomentum": 0.0}

# Where the self-check ratio should fall when per-layer times account for the whole step.
SELF_CHECK_BAND = (0.85, 1.15)

Progress = Callable[[int, int, str], None]  # (steps done, steps total, what runs now)


TIMERS = ("auto", "wall", "cpu")


class _Clock:
    """Time marks: CUDA events on a GPU (read after a synchronize); on CPU either the wall clock
    or this thread's CPU time.

    The CPU-time clock ignores the moments the OS runs another process instead of this one, which
    on a shared machine otherwise land on random layers and inflate single samples by whole
    scheduler slices. It only sees this thread's work, so ``auto`` uses it when torch computes on
    one thread (the CPU autograd engine runs on the calling thread) and the wall clock otherwise.
    """

    def __init__(self, device: torch.device, timer: str = "auto"):
        if timer not in TIMERS:
            raise ValueError(f"timer must be one of {TIMERS}, got {timer!r}")
        self.cuda = device.type == "cuda"
        self.device = device
        cpu_time = timer == "cpu" or (timer == "auto" and torch.get_num_threads() == 1)
        self.kind = "cuda_event" if self.cuda else ("thread_time" if cpu_time else "perf_counter")
        self._now = time.thread_time if self.kind == "thread_time" else time.perf_counter

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self._now()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) if self.cuda else (b - a) * 1000.0


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


class _LayerClock(fx.Interpreter):
    """Runs the layer graph once, charging each node's forward time to its layer and hooking
    each layer output so the backward can be split among layers."""

    def __init__(self, lg: LayerGraph, owner: dict[str, str], clock: _Clock, float_leaves: bool = False):
        super().__init__(lg.gm)
        self.owner = owner
        # the input-gradient pass: a layer's floating-point output that needs no gradient (one
        # computed from integer inputs alone, e.g. an embedding's, with parameters frozen)
        # becomes a leaf that does, as the runtime's BI carries the chain down to such outputs
        self.float_leaves = float_leaves
        self.layer_names = {layer.node.name: layer.name for layer in lg.layers if layer.kind == "layer"}
        self.clock = clock
        self.forward_marks: list[tuple[str, Any, Any]] = []  # (layer, start, end)
        self.backward_marks: list[tuple[str, Any]] = []  # (layer, when autograd reached it)
        # A hook on a leaf (a parameter read by get_attr) outlives the step: removed after it.
        self.handles: list[Any] = []

    def run_node(self, n: fx.Node) -> Any:
        if n.op in ("placeholder", "output"):
            return super().run_node(n)
        # Fetch the arguments outside the timed region: only the op itself is charged.
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        start = self.clock.mark()
        value = getattr(self, n.op)(n.target, args, kwargs)
        end = self.clock.mark()
        if n.name in self.owner:  # a dead helper (an unused shape item) has no layer
            self.forward_marks.append((self.owner[n.name], start, end))
        if self.float_leaves and n.name in self.layer_names:
            value = _as_leaves(value)
        if n.name in self.layer_names:
            for t in flat_tensors(value):
                if t.requires_grad:
                    self.handles.append(t.register_hook(self._reached(self.layer_names[n.name])))
        return value

    def _reached(self, name: str) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            self.backward_marks.append((name, self.clock.mark()))

        return hook


def _as_leaves(value: Any) -> Any:
    """``value`` with each floating-point tensor that needs no gradient made a leaf that does."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and not value.requires_grad:
            return value.detach().requires_grad_(True)
        return value
    if isinstance(value, (tuple, list)) and not hasattr(value, "_fields"):
        return type(value)(_as_leaves(v) for v in value)
    return value


def _owners(lg: LayerGraph) -> dict[str, str]:
    """Which layer each node's forward time is charged to (node name -> layer name)."""
    owner: dict[str, str] = {}
    for layer in lg.layers:
        for helper in layer.helpers:
            owner.setdefault(helper.name, layer.name)
        owner[layer.node.name] = layer.name
    return owner


def _zero_grads(params: Sequence[torch.Tensor]) -> None:
    for p in params:
        p.grad = None  # each step starts without gradients, as after optimizer.zero_grad(set_to_none)


def _backward(outputs: Any) -> None:
    outs = [o for o in as_tuple(outputs) if isinstance(o, torch.Tensor) and o.requires_grad]
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])


def _instrumented_step(lg: LayerGraph, owner: dict[str, str], clock: _Clock, inputs: tuple,
                       params: Sequence[torch.Tensor], accumulate: bool,
                       precision: str = "fp32", float_leaves: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """One forward+backward of the layer graph: per-layer forward and backward milliseconds."""
    if not accumulate:
        _zero_grads(params)
    runner = _LayerClock(lg, owner, clock, float_leaves)
    with autocast(clock.device.type, precision):
        out = runner.run(*inputs)
    try:
        _backward(out)
        end = clock.mark()
    finally:
        for handle in runner.handles:
            handle.remove()
    clock.sync()
    fwd: dict[str, float] = {}
    for layer, a, b in runner.forward_marks:
        fwd[layer] = fwd.get(layer, 0.0) + clock.ms(a, b)
    bwd: dict[str, float] = {}
    marks = runner.backward_marks
    for i, (layer, when) in enumerate(marks):
        nxt = marks[i + 1][1] if i + 1 < len(marks) else end
        bwd[layer] = bwd.get(layer, 0.0) + clock.ms(when, nxt)
    return fwd, bwd


def _input_grad_step(lg: LayerGraph, owner: dict[str, str], clock: _Clock, inputs: tuple,
                     params: Sequence[torch.Tensor], precision: str = "fp32") -> dict[str, float]:
    """One forward+backward with the parameters frozen: per-layer input-gradient milliseconds."""
    flags = [p.requires_grad for p in params]
    leaves = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in inputs)
    try:
        for p in params:
            p.requires_grad_(False)
        return _instrumented_step(lg, owner, clock, leaves, params, accumulate=True, precision=precision,
                                  float_leaves=True)[1]
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)


def _fed_by_inputs_only(lg: LayerGraph) -> set[str]:
    """Layers all of whose data comes straight from model inputs (no input gradient to compute)."""
    inputs = set(lg.input_names())
    preds: dict[str, set[str]] = {}
    for a, b in lg.edges():
        preds.setdefault(b, set()).add(a)
    return {name for name, ps in preds.items() if ps <= inputs}


def _plain_step(model: nn.Module, clock: _Clock, inputs: tuple, params: Sequence[torch.Tensor],
                accumulate: bool, precision: str = "fp32") -> tuple[float, float]:
    """One forward+backward of the unsplit model: (forward ms, backward ms)."""
    if not accumulate:
        _zero_grads(params)
    a = clock.mark()
    with autocast(clock.device.type, precision):
        out = model(*inputs)
    b = clock.mark()
    _backward(out)
    c = clock.mark()
    clock.sync()
    return clock.ms(a, b), clock.ms(b, c)


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
    ``_Clock``): ``auto``, ``wall`` or ``cpu``; CUDA always uses CUDA events. ``accumulate``:
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
    clock = _Clock(dev, timer)
    owner = _owners(lg)
    params = list(model.parameters())
    steps = warmup + repeats
    load = inputs if load_input is None else tuple(t.to(dev) for t in as_tuple(load_input))
    with ConcurrentLoad(model, load, concurrent, precision):
        fwd_samples, bwd_samples, bi_samples, step_f, step_b, instrumented = _measure(
            lg, model, owner, clock, inputs, params, warmup, repeats, accumulate, split_backward, progress, precision)
        seen_params: set[int] = set()
        own = {layer.name: _own_parameters(lg, layer, seen_params) for layer in lg.layers if layer.kind == "layer"}
        step_now = clock._now if not clock.cuda else _synced_now
        opt_ms = optimizer_ms(own, optimizer, repeats, step_now) if optimizer_steps else {}
    _zero_grads(params)
    if progress:
        progress(steps, steps, "done")
    input_fed = _fed_by_inputs_only(lg)

    entries: list[Layer] = []
    for layer in lg.layers:
        entry = Layer(name=layer.name, desc=layer.desc, activation_bytes=_activation_bytes(lg.values[layer.name]))
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


def _synced_now() -> float:
    torch.cuda.synchronize()
    return time.perf_counter()


def _measure(lg, model, owner, clock, inputs, params, warmup, repeats, accumulate, split_backward, progress,
             precision="fp32"):
    """Per-layer samples: forward, backward and (optional) input-gradient times, and the plain
    steps' forward and backward for the self-check."""
    names = lg.names()
    fwd_samples: dict[str, list[float]] = {name: [] for name in names}
    bwd_samples: dict[str, list[float]] = {name: [] for name in names}
    bi_samples: dict[str, list[float]] = {name: [] for name in names}
    step_f: list[float] = []
    step_b: list[float] = []
    instrumented: list[float] = []
    steps = warmup + repeats
    for r in range(steps):
        if progress:
            progress(r, steps, "warm-up" if r < warmup else f"step {r - warmup + 1}/{repeats}")
        # Instrumented and plain steps alternate so that both see the same background load.
        fwd, bwd = _instrumented_step(lg, owner, clock, inputs, params, accumulate, precision)
        f, b = _plain_step(model, clock, inputs, params, accumulate, precision)
        bi = _input_grad_step(lg, owner, clock, inputs, params, precision) if split_backward else {}
        if r >= warmup:
            for name in names:
                fwd_samples[name].append(fwd.get(name, 0.0))
                bwd_samples[name].append(bwd.get(name, 0.0))
                bi_samples[name].append(bi.get(name, 0.0))
            step_f.append(f)
            step_b.append(b)
            instrumented.append(sum(fwd.values()) + sum(bwd.values()))
    return fwd_samples, bwd_samples, bi_samples, step_f, step_b, instrumented


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
