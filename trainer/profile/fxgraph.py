"""Flatten an ``nn.Module`` with torch.fx into a topologically ordered DAG of layers.

A *layer* is an fx node whose value is a tensor, or a tuple/list of tensors nested at will
(``chunk``; an ``nn.LSTM``'s ``(output, (h, c))``): what can be timed and sent between pipeline
stages, the nested kind as its flat tensors. Model inputs are layers too (kind
``input``, like PipeDream's ``Input`` node). Every other node (``x.shape``, ``size``, integer
arithmetic, ...) is a *helper*: it is cheap, never crosses a stage boundary, and is recomputed
inside each layer that needs it. A layer's dependencies are therefore the layers it reads
directly or through helpers; those are the profile's edges.

Layer names are fx node names, so a plan made from a profile names the nodes that
:func:`pipeboard.trainer.partition.split_model` cuts.

A module marked with :func:`mark_leaf` (or whose class sets ``_pipeboard_leaf = True``) is traced
as one ``call_module`` node, i.e. one layer, instead of being flattened: that is how a model whose
insides fx cannot trace (a transformers decoder block with its Python control flow) is split at
module boundaries (see :mod:`pipeboard.trainer.task.hf`). Its inner modules still run as modules, so forward
hooks on them (the runtime's weight-gradient split) fire as usual.
"""

from __future__ import annotations

import inspect
import operator
import os
import traceback
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import fx, nn


class UntraceableModelError(ValueError):
    """torch.fx could not flatten the model; the message names the failing op and source line."""


@dataclass
class LayerNode:
    name: str
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
    outputs: list[str]  # layer names the model returns, flattened, in order
    output_is_tuple: bool
    values: dict[str, Any]  # example value of every layer (detached)
    requires_grad: dict[str, bool]
    order: dict[str, int]  # fx node name -> position in the traced graph

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


def as_tuple(example_input: Any) -> tuple:
    return tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,)


def _user_frame(exc: BaseException) -> str:
    """The innermost traceback frame outside torch: the user's line that made tracing fail."""
    torch_dir = os.path.dirname(torch.__file__)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(torch_dir)]
    if not frames:
        return ""
    f = frames[-1]
    return f" at {os.path.basename(f.filename)}:{f.lineno} in {f.name}(): `{(f.line or '').strip()}`"


def _defaults_beyond(model: nn.Module, n_inputs: int) -> dict[str, Any]:
    """forward's parameters after the first ``n_inputs`` when all of them have defaults (e.g.
    ``mask=None``): traced as those constants. Empty when there are none or one lacks a default."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return {}
    rest = params[n_inputs:]
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if not rest or any(p.kind not in positional or p.default is inspect.Parameter.empty for p in rest):
        return {}
    return {p.name: p.default for p in rest}


def _drop_constant_inputs(gm: fx.GraphModule, n_inputs: int) -> None:
    """Remove the placeholders fx keeps for constant arguments, with the checks it attaches to
    them, so the graph's inputs are exactly the example's tensors."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    doomed: list[fx.Node] = []
    seen: set[fx.Node] = set()
    stack = list(placeholders[n_inputs:])
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        doomed.append(node)
        stack.extend(node.users)
    if any(user not in seen for node in doomed for user in node.users) or any(n.op == "output" for n in doomed):
        return  # a constant argument feeds the computation itself; keep the graph as it is
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in sorted(doomed, key=order.__getitem__, reverse=True):
        gm.graph.erase_node(node)
    gm.recompile()


LEAF_ATTR = "_pipeboard_leaf"


def mark_leaf(module: nn.Module) -> nn.Module:
    """Make the tracer keep ``module`` whole: one fx node, one layer. Returns the module.

    It sets an instance attribute (no parameter, buffer or state-dict entry); a class can set
    ``_pipeboard_leaf = True`` instead to make all its instances leaves."""
    setattr(module, LEAF_ATTR, True)
    return module


def is_leaf(module: nn.Module) -> bool:
    """Whether ``module`` is marked as a leaf (instance or class attribute)."""
    return getattr(module, LEAF_ATTR, False) is True


class LeafTracer(fx.Tracer):
    """fx's tracer, with modules marked by :func:`mark_leaf` kept as leaves besides fx's own
    (the modules of ``torch.nn`` but ``Sequential``)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return is_leaf(m) or super().is_leaf_module(m, module_qualified_name)


def symbolic_trace(model: nn.Module, n_inputs: int | None = None) -> fx.GraphModule:
    """fx-trace ``model`` (marked leaf modules kept whole); with ``n_inputs``, forward parameters
    beyond them that have defaults are traced as those defaults."""
    constants = _defaults_beyond(model, n_inputs) if n_inputs is not None else {}
    try:
        # what fx.symbolic_trace does, with LeafTracer instead of fx.Tracer
        tracer = LeafTracer()
        graph = tracer.trace(model, concrete_args=constants or None)
        gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    except Exception as exc:  # fx raises TraceError, TypeError, RuntimeError, ... depending on the op
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UntraceableModelError(
            f"cannot trace {type(model).__name__} with torch.fx{_user_frame(exc)}: {first}"
        ) from None
    if constants:
        _drop_constant_inputs(gm, n_inputs)
    return gm


def _op_label(node: fx.Node, gm: fx.GraphModule) -> str:
    if node.op == "call_module":
        return f"module {node.target} ({type(gm.get_submodule(str(node.target))).__name__})"
    if node.op == "call_function":
        return f"function {getattr(node.target, '__name__', str(node.target))}"
    if node.op == "call_method":
        return f"method .{node.target}()"
    return f"{node.op} {node.target}"


class _Recorder(fx.Interpreter):
    """Runs the traced graph once, keeping every node's value; a failure names the node."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        try:
            value = super().run_node(n)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UntraceableModelError(
                f"running the traced model failed at node {n.name!r} ({_op_label(n, self.module)}): {first}"
            ) from None
        self.values[n.name] = value
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


def _describe(node: fx.Node, gm: fx.GraphModule) -> str:
    if node.op == "placeholder":
        return "Input"
    if node.op == "call_module":
        return " ".join(repr(gm.get_submodule(str(node.target))).split())[:200]
    if node.op == "call_function":
        name = getattr(node.target, "__name__", str(node.target))
        return {"add": "Add", "mul": "Mul", "getitem": "GetItem"}.get(name, name)
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    return f"get_attr {node.target}"


def _detach(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return type(value)(_detach(v) for v in value)
    return value


def trace_layers(model: nn.Module, example_input: Any) -> LayerGraph:
    """Trace ``model``, run it once on ``example_input`` and group its nodes into layers."""
    inputs = as_tuple(example_input)
    gm = symbolic_trace(model, len(inputs))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise UntraceableModelError(
            f"the model's forward takes {len(placeholders)} input(s) but the example input has {len(inputs)}"
        )
    for n, value in zip(placeholders, inputs):
        if not isinstance(value, torch.Tensor):
            raise UntraceableModelError(f"example input for {n.name!r} must be a tensor, got {type(value).__name__}")
    recorder = _Recorder(gm)
    try:
        with torch.enable_grad():  # requires_grad of each value says which activations get gradients
            recorder.run(*inputs)
    except UntraceableModelError as exc:  # fx.Interpreter appends the node dump: keep one line
        raise UntraceableModelError(str(exc).splitlines()[0]) from None
    values = recorder.values

    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    layers: list[LayerNode] = []
    is_layer: dict[str, bool] = {}
    # Per node: the layers it reads through helpers, and the helpers it needs (for helpers only).
    helper_deps: dict[str, tuple[list[str], list[fx.Node]]] = {}
    output_node = None
    for node in gm.graph.nodes:
        if node.op == "output":
            output_node = node
            continue
        paths = tensor_paths(values[node.name])
        deps: list[str] = []
        helpers: list[fx.Node] = []
        for src in node.all_input_nodes:
            if is_layer[src.name]:
                deps.append(src.name)
            else:
                sub_deps, sub_helpers = helper_deps[src.name]
                deps.extend(sub_deps)
                helpers.extend(sub_helpers)
                helpers.append(src)
        deps = list(dict.fromkeys(deps))
        helpers = list(dict.fromkeys(helpers))
        if node.op == "placeholder" or paths is not None:
            is_layer[node.name] = True
            helpers.sort(key=lambda h: order[h.name])
            nested = paths is not None and paths != [()]
            layers.append(LayerNode(
                name=node.name, node=node, kind="input" if node.op == "placeholder" else "layer",
                deps=deps, helpers=helpers, desc=_describe(node, gm), paths=paths if nested else [],
            ))
        else:
            is_layer[node.name] = False
            helper_deps[node.name] = (deps, helpers)

    assert output_node is not None
    out_arg = output_node.args[0]
    output_is_tuple = isinstance(out_arg, (tuple, list))
    outputs = []
    for item in (out_arg if output_is_tuple else (out_arg,)):
        # a tuple-valued layer returned as a whole (``return x.chunk(2)``) is flattened like any
        # other crossing value
        if not isinstance(item, fx.Node) or not is_layer.get(item.name):
            raise UntraceableModelError("the model must return a tensor or a flat tuple of tensors")
        outputs.append(item.name)
    kept = {layer.name: _detach(values[layer.name]) for layer in layers}
    grads = {layer.name: any(t.requires_grad for t in flat_tensors(values[layer.name])) for layer in layers}
    return LayerGraph(gm=gm, layers=layers, outputs=outputs, output_is_tuple=output_is_tuple,
                      values=kept, requires_grad=grads, order=order)


def flat_slots(lg: LayerGraph, names: Sequence[str]) -> list[tuple[str, int | None]]:
    """The flat tensor positions of ``names``: (name, None) for a tensor, (name, i) per tensor of a
    tuple-valued layer (``i`` indexes its ``paths``)."""
    by_name = lg.by_name()
    slots: list[tuple[str, int | None]] = []
    for name in names:
        k = by_name[name].n_outputs
        slots.extend([(name, None)] if k is None else [(name, i) for i in range(k)])
    return slots


def build_submodule(lg: LayerGraph, members: Sequence[str], inputs: Sequence[str], outputs: Sequence[str]) -> fx.GraphModule:
    """A GraphModule computing layers ``members`` (graph order) from the layers ``inputs``.

    Its forward takes the flat tensors of ``inputs`` and returns a tuple of the flat tensors of
    ``outputs`` (an output may also be an input: it is passed through). Submodules and parameters
    are shared with the traced model, not copied.
    """
    by_name = lg.by_name()
    graph = fx.Graph()
    env: dict[str, Any] = {}
    for name in inputs:
        k = by_name[name].n_outputs
        if k is None:
            env[name] = graph.placeholder(name)
        else:  # a tuple-valued layer arrives as k tensors and is regrouped for its readers
            env[name] = _regroup(lg.values[name], iter([graph.placeholder(f"{name}_{i}") for i in range(k)]))
    member_set = set(members)
    for name in sorted(member_set, key=lambda m: lg.order[m]):
        layer = by_name[name]
        for helper in layer.helpers:
            if helper.name not in env:
                env[helper.name] = graph.node_copy(helper, lambda n: env[n.name])
        env[name] = graph.node_copy(layer.node, lambda n: env[n.name])
    flat_out = []
    for name, i in flat_slots(lg, outputs):
        value = env[name]
        for index in ([] if i is None else by_name[name].paths[i]):
            # an input's regrouped tuple is indexed here; a value computed in the stage, in the graph
            value = value[index] if isinstance(value, tuple) else graph.call_function(operator.getitem, (value, index))
        flat_out.append(value)
    graph.output(tuple(flat_out))
    graph.lint()
    return fx.GraphModule(lg.gm, graph)


def _regroup(example: Any, tensors: Any) -> Any:
    """The next tensors of ``tensors`` in the nesting of ``example`` (tuples throughout)."""
    if isinstance(example, (tuple, list)):
        return tuple(_regroup(item, tensors) for item in example)
    return next(tensors)
