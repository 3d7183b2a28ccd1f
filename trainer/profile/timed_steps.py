"""The training steps that ``profile_model`` times, and the clock that marks them: instrumented
steps of the layer graph that charge each node's forward and each stretch of the backward to its
layer (the input-gradient pass among them), and plain steps of the whole model for the self-check.
How and why layers are timed in place: the module docstring of ``profiler.py``."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch
from torch import fx, nn

from pipeboard.trainer.precision import autocast
from pipeboard.trainer.profile.capture import as_tuple
from pipeboard.trainer.profile.layergraph import LayerGraph, flat_tensors


TIMERS = ("auto", "wall", "cpu")


class Clock:
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


def synced_now() -> float:
    torch.cuda.synchronize()
    return time.perf_counter()


class _LayerClock(fx.Interpreter):
    """Runs the layer graph once, charging each node's forward time to its layer and hooking
    each layer output so the backward can be split among layers."""

    def __init__(self, lg: LayerGraph, owner: dict[str, str], clock: Clock, float_leaves: bool = False):
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


def owners(lg: LayerGraph) -> dict[str, str]:
    """Which layer each node's forward time is charged to (node name -> layer name)."""
    owner: dict[str, str] = {}
    for layer in lg.layers:
        for helper in layer.helpers:
            owner.setdefault(helper.name, layer.name)
        owner[layer.node.name] = layer.name
    return owner


def zero_grads(params: Sequence[torch.Tensor]) -> None:
    for p in params:
        p.grad = None  # each step starts without gradients, as after optimizer.zero_grad(set_to_none)


def _backward(outputs: Any) -> None:
    outs = [o for o in as_tuple(outputs) if isinstance(o, torch.Tensor) and o.requires_grad]
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])


def _instrumented_step(lg: LayerGraph, owner: dict[str, str], clock: Clock, inputs: tuple,
                       params: Sequence[torch.Tensor], accumulate: bool,
                       precision: str = "fp32", float_leaves: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """One forward+backward of the layer graph: per-layer forward and backward milliseconds."""
    if not accumulate:
        zero_grads(params)
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


def _input_grad_step(lg: LayerGraph, owner: dict[str, str], clock: Clock, inputs: tuple,
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


def _plain_step(model: nn.Module, clock: Clock, inputs: tuple, params: Sequence[torch.Tensor],
                accumulate: bool, precision: str = "fp32") -> tuple[float, float]:
    """One forward+backward of the unsplit model: (forward ms, backward ms)."""
    if not accumulate:
        zero_grads(params)
    a = clock.mark()
    with autocast(clock.device.type, precision):
        out = model(*inputs)
    b = clock.mark()
    _backward(out)
    c = clock.mark()
    clock.sync()
    return clock.ms(a, b), clock.ms(b, c)


def measure(lg, model, owner, clock, inputs, params, warmup, repeats, accumulate, split_backward, progress,
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
