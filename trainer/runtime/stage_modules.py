"""Cut a task's model into stage modules and learn what crosses each stage boundary.

Stages come from a plan (layer names per stage) or a uniform split balanced by parameter count.
The cut itself is ``pipeboard.trainer.partition.split_model`` (DAG-aware, over the layers of the
model captured with torch.export): stage ``k`` takes the
tensors entering it and returns the tensors leaving it. Every worker builds the whole model from
the same seed and keeps its own stages, so replicas and reruns start from identical weights.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from pipeboard.trainer.precision import autocast
from pipeboard.trainer.profile.capture import as_tuple
from pipeboard.trainer.runtime.comm import BoundarySpec, TensorSpec


def load_task(cfg):
    """The task ``cfg`` names (zoo name or factory, model arguments, data), built from its seed,
    with the run's optimizer override applied (``--lr`` is applied where optimizers are made)."""
    from pipeboard.trainer.spec import load_task as load

    task = load(cfg.model, cfg.model_args, cfg.data, cfg.seed)
    if cfg.optimizer:
        task.optimizer = cfg.optimizer
    return task


def layer_names(model: nn.Module, example, layers: Sequence[str] | None = None) -> list[str]:
    """The model's layers (inputs excluded) in topological order, as ``split_model`` names them."""
    return [name for name, _ in layer_sizes(model, example, layers)]


def layer_sizes(model: nn.Module, example, layers: Sequence[str] | None = None) -> list[tuple[str, int]]:
    """(layer name, parameter count) in topological order: the balance weight of a uniform split.
    Layers without parameters (activations, reshapes) count 1, so they still spread evenly."""
    from pipeboard.trainer.profile.outline import capture_layers

    lg = capture_layers(model, as_tuple(example), layers)
    return [(layer.name, max(1, sum(p.numel() for p in lg.gm.get_submodule(str(layer.node.target)).parameters())))
            for layer in lg.layers if layer.kind == "layer"]


def uniform_split(names: Sequence[str], sizes: Sequence[float], num_stages: int) -> list[list[str]]:
    """Contiguous, non-empty stages whose summed ``sizes`` are as equal as the cuts allow."""
    n = len(names)
    if not 1 <= num_stages <= n:
        raise ValueError(f"stages: cannot split {n} layers into {num_stages} non-empty stages")
    cum = [0.0]
    for size in sizes:
        cum.append(cum[-1] + float(size))
    cuts = [0]
    for k in range(1, num_stages):
        goal = cum[-1] * k / num_stages
        lo, hi = cuts[-1] + 1, n - (num_stages - k)
        cuts.append(min(range(lo, hi + 1), key=lambda i: abs(cum[i] - goal)))
    cuts.append(n)
    return [list(names[cuts[k]:cuts[k + 1]]) for k in range(num_stages)]


def stage_layers(cfg, task, num_stages: int) -> list[list[str]]:
    """The plan's stages, or a uniform split of the task's model balanced by parameter count."""
    if cfg.stages:
        return [list(s) for s in cfg.stages]
    sizes = layer_sizes(task.model, task.example_input(cfg.microbatch_size), task.layers)
    return uniform_split([n for n, _ in sizes], [z for _, z in sizes], num_stages)


def build_stages(model: nn.Module, example, stages: list[list[str]],
                 layers: Sequence[str] | None = None, dynamic: dict[int, int | None] | None = None) -> list[nn.Module]:
    """The stage modules of ``stages`` (layer names), ``layers`` the task's granularity,
    ``dynamic`` the input dimensions whose size varies (``Task.varying_dims``)."""
    from pipeboard.trainer import partition

    return list(partition.split_model(model, example, stages, layers, dynamic))


def resized(example, dims: dict[int, int]) -> tuple:
    """``example``'s inputs with each dimension in ``dims`` cut or zero-padded to its size there."""
    out = []
    for t in as_tuple(example):
        for d, size in dims.items():
            if 0 < d < t.dim() and t.shape[d] != size:
                if size < t.shape[d]:
                    t = t.narrow(d, 0, size)
                else:
                    t = torch.cat([t, t.new_zeros((*t.shape[:d], size - t.shape[d], *t.shape[d + 1:]))], dim=d)
        out.append(t)
    return tuple(out)


@torch.no_grad()
def _shapes(modules: Sequence[nn.Module], xs: tuple, precision: str, device_type: str) -> list[list]:
    shapes = []
    for m in modules[:-1]:
        with autocast(device_type, precision):
            out = m(*xs)
        xs = out if isinstance(out, tuple) else (out,)
        shapes.append([(tuple(t.shape), t.dtype) for t in xs])
    return shapes


def boundary_specs(modules: Sequence[nn.Module], example, precision: str = "fp32",
                   device_type: str = "cpu", dynamic: dict[int, int | None] | None = None) -> list[BoundarySpec]:
    """What crosses each boundary (between stage k and k + 1) for one microbatch, in the dtypes
    the run's precision makes (bf16 activations cross as bf16). With ``dynamic`` input dimensions,
    the stages also run at another size of them: the boundary dimensions that change with it are
    dynamic, and a third run at the declared largest sizes gives each tensor's largest shape."""
    xs: tuple = as_tuple(example)
    base = _shapes(modules, xs, precision, device_type)
    dims = {d: most for d, most in (dynamic or {}).items() if any(0 < d < t.dim() for t in xs)}
    if not dims:
        return [BoundarySpec(tuple(TensorSpec(s, dt) for s, dt in b)) for b in base]
    size = {d: next(t.shape[d] for t in xs if 0 < d < t.dim()) for d in dims}
    other = _shapes(modules, resized(xs, {d: n - 1 if n > 2 else n + 1 for d, n in size.items()}),
                    precision, device_type)
    bounded = all(most is not None for most in dims.values())
    largest = _shapes(modules, resized(xs, dims), precision, device_type) if bounded else base
    return [BoundarySpec(tuple(TensorSpec(big, dt, tuple(d for d, (x, y) in enumerate(zip(s, o)) if x != y))
                               for (s, dt), (o, _), (big, _) in zip(b, ob, lb)), bounded)
            for b, ob, lb in zip(base, other, largest)]
