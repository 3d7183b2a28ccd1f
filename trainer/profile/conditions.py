"""Measurements the profiler adds for the runtime's conditions: optimizer steps per layer, and a
concurrent load standing in for the other stage workers that share the machine.

Optimizer steps: each layer's parameters are cloned (the model is left untouched) with
gradients of the same shapes, an optimizer per layer is built over the clones and stepped twice
to create its state, then ``repeats`` rounds of steps are timed, the layers taking turns; the
median is the layer's ``optimizer_ms``.

Concurrent load: pipeline stages of one machine run at once and share its memory bandwidth and
last-level cache, so a layer inside a pipeline runs slower than the same layer profiled alone
(measured here: about 10-20% on a 2-core VM for a 1024-wide MLP). ``ConcurrentLoad(model,
inputs, n)`` forks ``n`` processes (one torch thread each) that train the same model on the same
input, forward and backward with accumulating gradients, until the block ends; the profile is
measured meanwhile, under the load the other stages would make.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch
from torch import nn

from pipeboard.trainer.precision import autocast
from pipeboard.trainer.profile.capture import as_tuple


def make_optimizer(name: str, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The optimizer ``name`` (the profiler's names) over ``params``; the learning rate does not
    change what a step costs."""
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9)
    if name == "sgd-nomomentum":
        return torch.optim.SGD(params, lr=1e-4)
    raise ValueError(f"unknown optimizer {name!r}")


def optimizer_ms(groups: dict[str, Sequence[torch.Tensor]], optimizer: str, repeats: int,
                 now: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median milliseconds of one optimizer step per group (layer) of parameters, stepped over
    copies of them. The groups take turns, as a stage's layers do in its step, so each group's
    weights, gradients and state have left the cache by its next step, as they have in training
    (stepping one layer over and over keeps its few megabytes cached and takes half the time)."""
    opts: dict[str, torch.optim.Optimizer] = {}
    for name, params in groups.items():
        if params:
            clones = [p.detach().clone().requires_grad_(True) for p in params]
            for c in clones:
                c.grad = torch.full_like(c, 1e-3)
            opts[name] = make_optimizer(optimizer, clones)
    times: dict[str, list[float]] = {name: [] for name in opts}
    for i in range(repeats + 2):  # two untimed rounds create the optimizer state
        for name, opt in opts.items():
            t0 = now()
            opt.step()
            t1 = now()
            if i >= 2:
                times[name].append((t1 - t0) * 1e3)
    return {name: float(statistics.median(times[name])) if name in times else 0.0 for name in groups}


def _load_worker(model: nn.Module, inputs: tuple, ready, stop, precision: str = "fp32") -> None:
    torch.set_num_threads(1)
    ready.set()
    while not stop.is_set():
        with autocast("cpu", precision):
            outs = [o for o in as_tuple(model(*inputs)) if isinstance(o, torch.Tensor) and o.requires_grad]
        if outs:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])


class ConcurrentLoad:
    """``with ConcurrentLoad(model, inputs, n):`` runs ``n`` training loops of ``model`` in other
    processes while the block runs (nothing for ``n == 0``), forwards in ``precision``."""

    def __init__(self, model: nn.Module, inputs: tuple, n: int, precision: str = "fp32") -> None:
        if n < 0:
            raise ValueError(f"concurrent load must be >= 0 processes, got {n}")
        self.model, self.inputs, self.n, self.precision = model, inputs, n, precision
        self.procs: list[Any] = []

    def __enter__(self) -> ConcurrentLoad:
        if self.n == 0:
            return self
        import torch.multiprocessing as mp

        ctx = mp.get_context("fork")
        self.stop = ctx.Event()
        readies = []
        for _ in range(self.n):
            ready = ctx.Event()
            p = ctx.Process(target=_load_worker, args=(self.model, self.inputs, ready, self.stop, self.precision),
                            daemon=True)
            p.start()
            self.procs.append(p)
            readies.append(ready)
        for ready in readies:
            if not ready.wait(60):
                self.__exit__(None, None, None)
                raise RuntimeError("concurrent load: a load process did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.procs:
            return
        self.stop.set()
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join(5)
        self.procs = []
