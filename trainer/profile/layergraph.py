"""A model as a DAG of layers, and the GraphModule that computes any contiguous part of it.

A *layer* is a node of a small top-level fx graph (made by :mod:`outline`) whose value is a
tensor or a tuple of tensors nested at will (an ``nn.LSTM``'s ``(output, (h, c))``): what can be
timed and sent between pipeline stages, the nested kind as its flat tensors. Model inputs are
layers too (kind ``input``, like PipeDream's ``Input`` node). The other nodes (``getitem`` on a
layer's tuple) are *helpers*: free, never crossing a stage boundary, recomputed inside each layer
that needs them. A layer's dependencies are the layers it reads directly or through helpers;
those are the profile's edges.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import fx


@dataclass
class LayerNode:
    name: str  # a module path (``hf.model.layers.3``) or, for an input, its parameter name
    node: fx.Node
    kind: str  # "input" or "layer"
    deps: list[str] = field(default_factory=list)
    helpers: list[fx.Node] = field(default_factory=list)  # in graph order
    desc: str = ""
    paths: list[tuple[int, ...]] = field(default_factory=list)  # a tuple's: each tensor's index path; a tensor's: []

    @property
    def n_outputs(self) -> int | None:
        """None: one tensor; k: a (nested) tuple of k tensors."""
        return len(self.paths) or None


@dataclass
class LayerGraph:
    gm: fx.GraphModule
    layers: list[LayerNode]
    output_slots: list[tuple[str, int | None]]  # the model's flat outputs: (layer, index into its tuple)
    values: dict[str, Any]  # example value of every layer (detached)
    requires_grad: dict[str, bool]
    order: dict[str, int]  # fx node name -> position in the top-level graph
    out_spec: Any = None  # the pytree spec that rebuilds what the model returns from its flat outputs

    @property
    def outputs(self) -> list[str]:
        """The layers whose values the model returns, each once, in order."""
        return list(dict.fromkeys(name for name, _ in self.output_slots))

    def names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    def by_name(self) -> dict[str, LayerNode]:
        return {layer.name: layer for layer in self.layers}

    def input_names(self) -> list[str]:
        return [layer.name for layer in self.layers if layer.kind == "input"]

    def edges(self) -> list[tuple[str, str]]:
        return [(dep, layer.name) for layer in self.layers for dep in layer.deps]

    def slot_value(self, name: str, i: int | None) -> torch.Tensor:
        """The example tensor of a flat slot (see :func:`flat_slots`)."""
        value = self.values[name]
        for index in ([] if i is None else self.by_name()[name].paths[i]):
            value = value[index]
        return value


def tensor_paths(value: Any) -> list[tuple[int, ...]] | None:
    """The index path of every tensor in ``value``, a tensor (``[()]``) or a non-empty tuple/list
    of them nested at will, in order; None when it holds anything else (a layer's value cannot)."""
    if isinstance(value, torch.Tensor):
        return [()]
    if not isinstance(value, (tuple, list)) or not value:
        return None
    paths: list[tuple[int, ...]] = []
    for i, item in enumerate(value):
        inner = tensor_paths(item)
        if inner is None:
            return None
        paths.extend((i, *path) for path in inner)
    return paths


def flat_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a layer's value, in the order of its flat slots."""
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in flat_tensors(item)]
    return [value]


def detach(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return type(value)(detach(v) for v in value)
    return value


def flat_slots(lg: LayerGraph, names: Sequence[str]) -> list[tuple[str, int | None]]:
    """The flat tensor positions of ``names``: (name, None) for a tensor, (name, i) per tensor of a
    tuple-valued layer (``i`` indexes its ``paths``)."""
    by_name = lg.by_name()
    slots: list[tuple[str, int | None]] = []
    for name in names:
        k = by_name[name].n_outputs
        slots.extend([(name, None)] if k is None else [(name, i) for i in range(k)])
    return slots


def build_submodule(lg: LayerGraph, members: Sequence[str], inputs: Sequence[str],
                    out_slots: Sequence[tuple[str, int | None]]) -> fx.GraphModule:
    """A GraphModule computing layers ``members`` from the layers ``inputs``.

    Its forward takes the flat tensors of ``inputs`` and returns a tuple of the tensors at
    ``out_slots`` (a slot's layer may also be an input: it is passed through). The layers'
    modules, hence parameters and buffers, are the captured model's, not copies.
    """
    by_name = lg.by_name()
    graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    for name in inputs:
        layer = by_name[name]
        k = layer.n_outputs
        if k is None:
            env[layer.node] = graph.placeholder(layer.node.name)
        else:  # a tuple-valued layer arrives as k tensors and is regrouped for its readers
            env[layer.node] = _regroup(lg.values[name], iter([graph.placeholder(f"{layer.node.name}_{i}")
                                                             for i in range(k)]))
    for name in sorted(set(members), key=lambda m: lg.order[by_name[m].node.name]):
        layer = by_name[name]
        for helper in layer.helpers:
            if helper not in env:
                env[helper] = _copy(graph, helper, env)
        env[layer.node] = _copy(graph, layer.node, env)
    flat_out = []
    for name, i in out_slots:
        value = env[by_name[name].node]
        for index in ([] if i is None else by_name[name].paths[i]):
            # an input's regrouped tuple is indexed here; a value computed in the stage, in the graph
            value = value[index] if isinstance(value, tuple) else graph.call_function(operator.getitem, (value, index))
        flat_out.append(value)
    graph.output(tuple(flat_out))
    graph.lint()
    return fx.GraphModule(lg.gm, graph)


def _copy(graph: fx.Graph, node: fx.Node, env: dict[fx.Node, Any]) -> Any:
    if node.op == "call_function" and node.target is operator.getitem and isinstance(env[node.args[0]], tuple):
        return env[node.args[0]][node.args[1]]  # an item of a regrouped input: no node needed
    return graph.node_copy(node, lambda n: env[n])


def _regroup(example: Any, tensors: Any) -> Any:
    """The next tensors of ``tensors`` in the nesting of ``example`` (tuples throughout)."""
    if isinstance(example, (tuple, list)):
        return tuple(_regroup(item, tensors) for item in example)
    return next(tensors)
