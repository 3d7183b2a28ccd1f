"""Cut a model into pipeline stages along its layer graph (the captured model's layers, see
``pipeboard.trainer.profile.outline``).

``split_model(model, example_input, stages)`` takes a stage assignment of layer names (what a
plan gives; the names are those of :func:`layer_names` and of the model's profile) and returns
one :class:`StageModule` per stage. Stage ``k`` takes the flat tuple of tensors crossing into it
and returns the flat tuple leaving it; ``stage_k.output_names == stage_{k+1}.input_names``, so the
runtime sends exactly ``stage_k``'s outputs to ``stage_{k+1}``. A value made in stage ``i`` and
read in stage ``j > i + 1`` (a skip connection) is passed through every stage in between. The
first stage takes the model's inputs; the last returns the model's outputs flat (always a tuple),
and its ``structure`` rebuilds what the model itself returns (a tensor, tuple, dict or
``ModelOutput``) for the loss.

Some crossing tensors are not differentiable (token ids, positions): a stage's
``output_requires_grad`` says which outputs carry a gradient back.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from pipeboard.trainer.profile.capture import as_tuple
from pipeboard.trainer.profile.layergraph import LayerGraph, build_submodule, flat_slots
from pipeboard.trainer.profile.outline import capture_layers


class PartitionError(ValueError):
    """A stage assignment that cannot be executed; the message names the layer and stage."""


class StageModule(nn.Module):
    """One pipeline stage: a GraphModule over a contiguous part of the layer graph.

    ``forward(*tensors)`` (or ``forward(tuple_of_tensors)``) returns a tuple of tensors. Parameters
    are shared with the model it was cut from.
    """

    def __init__(self, index: int, gm: fx.GraphModule, layers: list[str], input_names: list[str],
                 output_names: list[str], output_requires_grad: list[bool], out_spec=None):
        super().__init__()
        self.index = index
        self.gm = gm
        self.layers = layers
        self.input_names = input_names  # flat: "name" or "name.i" for an item of a tuple-valued layer
        self.output_names = output_names
        self.output_requires_grad = output_requires_grad
        self.out_spec = out_spec  # the last stage's: how the model's own output is built from its flat tensors

    def structure(self, outputs: Sequence[torch.Tensor]) -> Any:
        """What the model itself returns, made from this (last) stage's flat outputs: the value
        the task's loss and metric are written against."""
        if self.out_spec is None:
            return outputs[0] if len(outputs) == 1 else tuple(outputs)
        return pytree.tree_unflatten(list(outputs), self.out_spec)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(inputs) == 1 and isinstance(inputs[0], (tuple, list)):
            inputs = tuple(inputs[0])
        if len(inputs) != len(self.input_names):
            raise ValueError(f"stage {self.index} takes {len(self.input_names)} tensor(s) "
                             f"({', '.join(self.input_names)}), got {len(inputs)}")
        return self.gm(*inputs)

    def extra_repr(self) -> str:
        return f"index={self.index}, layers={len(self.layers)}, in={self.input_names}, out={self.output_names}"


def layer_names(model: nn.Module, example_input: Any, layers: Sequence[str] | None = None) -> list[str]:
    """The model's layer names in topological order (inputs first): what profiles and plans use."""
    return capture_layers(model, example_input, layers).names()


def uniform_stages(names: Sequence[str], num_stages: int) -> list[list[str]]:
    """Split names (in topological order) into ``num_stages`` contiguous runs of near-equal
    length; the simple split when no plan is at hand."""
    if not 1 <= num_stages <= len(names):
        raise PartitionError(f"num_stages must be between 1 and {len(names)} (the layer count), got {num_stages}")
    q, r = divmod(len(names), num_stages)
    out, start = [], 0
    for k in range(num_stages):
        size = q + (1 if k < r else 0)
        out.append(list(names[start : start + size]))
        start += size
    return out


def _slot_name(name: str, i: int | None) -> str:
    return name if i is None else f"{name}.{i}"


def _assign(lg: LayerGraph, stages: Sequence[Sequence[str]]) -> dict[str, int]:
    if not stages:
        raise PartitionError("stages must name at least one stage")
    by_name = lg.by_name()
    stage_of: dict[str, int] = {}
    for k, stage in enumerate(stages):
        if isinstance(stage, str) or not isinstance(stage, Sequence):
            raise PartitionError(f"stages[{k}] must be a list of layer names")
        for name in stage:
            if name not in by_name:
                raise PartitionError(f"stages[{k}]: unknown layer {name!r} (see pipeboard.trainer.partition.layer_names)")
            if name in stage_of:
                raise PartitionError(f"stages[{k}]: layer {name!r} is already in stage {stage_of[name]}")
            if by_name[name].kind == "input" and k != 0:
                raise PartitionError(f"stages[{k}]: model input {name!r} can only be in stage 0")
            stage_of[name] = k
    missing = [n for n in lg.names() if n not in stage_of and by_name[n].kind != "input"]
    if missing:
        raise PartitionError(f"layers not assigned to any stage: {', '.join(missing[:5])}"
                             + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""))
    for name in lg.input_names():
        stage_of[name] = 0
    for layer in lg.layers:
        for dep in layer.deps:
            if stage_of[dep] > stage_of[layer.name]:
                raise PartitionError(
                    f"layer {layer.name!r} in stage {stage_of[layer.name]} reads {dep!r} from the later "
                    f"stage {stage_of[dep]}: stages must follow the graph's topological order")
    # A stage with no layers of its own (e.g. only the model input) is allowed: it passes its
    # inputs through, which is what a uniform split by layer count can produce.
    return stage_of


def split_graph(lg: LayerGraph, stages: Sequence[Sequence[str]]) -> list[StageModule]:
    """:func:`split_model` on an already captured layer graph."""
    stage_of = _assign(lg, stages)
    n = len(stages)
    # last_use[v]: the last stage that reads v (n for a model output, which leaves the last stage).
    last_use = {name: stage_of[name] for name in lg.names()}
    for layer in lg.layers:
        for dep in layer.deps:
            last_use[dep] = max(last_use[dep], stage_of[layer.name])
    for name in lg.outputs:
        last_use[name] = n
    ordered = lg.names()
    boundaries = [[v for v in ordered if stage_of[v] <= k < last_use[v]] for k in range(n - 1)]
    modules = []
    for k in range(n):
        inputs = lg.input_names() if k == 0 else boundaries[k - 1]
        slots_out = list(lg.output_slots) if k == n - 1 else flat_slots(lg, boundaries[k])
        members = [v for v in ordered if stage_of[v] == k and v not in lg.input_names()]
        gm = build_submodule(lg, members, inputs, slots_out)
        slots_in = flat_slots(lg, inputs)
        grad = [_carries_grad(lg, name, i) for name, i in slots_out]
        modules.append(StageModule(
            k, gm, members, [_slot_name(*s) for s in slots_in], [_slot_name(*s) for s in slots_out], grad,
            lg.out_spec if k == n - 1 else None))
    return modules


def _carries_grad(lg: LayerGraph, name: str, i: int | None) -> bool:
    return lg.requires_grad[name] and lg.slot_value(name, i).is_floating_point()


def split_model(model: nn.Module, example_input: Any, stages: Sequence[Sequence[str]],
                layers: Sequence[str] | None = None, dynamic: dict[int, int | None] | None = None) -> list[StageModule]:
    """Cut ``model`` into one :class:`StageModule` per entry of ``stages`` (lists of layer names,
    each stage's layers reading only layers of the same or earlier stages; model inputs may be
    listed in stage 0 or left out); ``layers``: the granularity's module paths (default: see
    ``pipeboard.trainer.profile.granularity``)."""
    return split_graph(capture_layers(model, as_tuple(example_input), layers, dynamic), stages)


def run_stages(stage_modules: Sequence[StageModule], example_input: Any) -> tuple[torch.Tensor, ...]:
    """Run the stages in order in one process (for checks): the model's outputs as a tuple."""
    values = as_tuple(example_input)
    for stage in stage_modules:
        values = stage(*values)
    return values
