"""Turn a captured model into a graph of layers: one GraphModule per layer, called in order.

:func:`capture_layers` captures the model (:mod:`capture`), keys each op by its layer's module
path (:mod:`granularity`), and *outlines* each layer's ops into a GraphModule of its own. The
result is a small top-level graph: the model's inputs, one ``call_module`` per layer, and
``getitem`` on the layers that hand several tensors on. That top graph is what the profiler times
node by node and what :func:`layergraph.build_submodule` cuts into stages; a layer's name is its
module path (``hf.model.layers.3``), so plans and profiles speak the model's own names.

Ordering: an op outside every layer's module moves to just before its first consumer (see
:mod:`granularity` for why the consumer); an op no other op reads (a final scaling in the
model's own forward, an in-place buffer update) stays with the layer of its latest producer.
Layers are then the runs of equal keys in that order, so each is a contiguous stretch of a
topological order and the layer graph has no cycle; a module called twice with other layers in
between (a shared norm) is two layers, the second named ``path#2``.

Inside a layer, each call of a torch.nn leaf module (Linear, Conv2d, Dropout, BatchNorm, ...) that
takes one tensor and hands one on runs as that module again instead of as its captured ops: it
then follows ``train()``/``eval()`` (the capture recorded dropout and batch statistics as in
training) and the runtime's module hooks (weight gradients batched or stashed) see it.

Dynamic dimensions (a sequence length captured as a symbol, see :mod:`capture`): a size read once
(``sym_size(input_ids, 1)``) and used by many layers would cross layers as an int, which no stage
boundary carries. Each layer instead reads the size off a tensor it already has whose shape holds
the same symbol, and recomputes any arithmetic on it (``_symbolic``), so only tensors cross.
"""

from __future__ import annotations

import operator
from typing import Any, Sequence

import torch
from torch import fx, nn

from pipeboard.trainer.profile.capture import UntraceableModelError, as_tuple, capture
from pipeboard.trainer.profile.granularity import layer_keys
from pipeboard.trainer.profile.layergraph import LayerGraph, LayerNode, detach, flat_tensors, tensor_paths

OPS = ("call_function", "call_method", "call_module")


def _order_and_keys(gm: fx.GraphModule, keys: dict[fx.Node, str | None]) -> list[tuple[fx.Node, str]]:
    """The op nodes in layer order with each one's layer key (see the module docstring)."""
    ops = [n for n in gm.graph.nodes if n.op in OPS]
    if not any(keys.values()):  # a model with no module of its own around its ops: one layer
        return [(n, "forward") for n in ops]
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    anchor: dict[fx.Node, float] = {}
    key: dict[fx.Node, str] = {}
    deferred: list[fx.Node] = []
    for n in reversed(ops):
        if keys[n] is not None:
            anchor[n], key[n] = position[n], keys[n]
            continue
        users = [u for u in n.users if u in anchor]
        if users:  # glue: computed right before (and in the layer of) its first consumer
            first = min(users, key=lambda u: (anchor[u], position[u]))
            anchor[n], key[n] = anchor[first], key[first]
        else:
            deferred.append(n)
    first_key = next(key[n] for n in ops if n in key)
    for n in reversed(deferred):  # read by no placed op: with its latest producer, if it has one
        producers = [p for p in n.all_input_nodes if p in anchor]
        if producers:
            last = max(producers, key=lambda p: (anchor[p], position[p]))
            anchor[n], key[n] = anchor[last], key[last]
    for n in deferred:  # the rest (a weight's transpose read by such an op): with a consumer now placed
        if n in anchor:
            continue
        users = [u for u in n.users if u in anchor]
        if users:
            first = min(users, key=lambda u: (anchor[u], position[u]))
            anchor[n], key[n] = anchor[first], key[first]
        else:
            anchor[n], key[n] = -1, first_key
    for n in ops:  # an item of a multi-output op stays with the op: only tensors cross layers
        if n.target is operator.getitem and not isinstance(n.args[0].meta.get("val"), torch.Tensor) \
                and n.args[0] in anchor:
            anchor[n], key[n] = anchor[n.args[0]], key[n.args[0]]
    ordered = sorted(ops, key=lambda n: (anchor[n], position[n]))
    return [(n, key[n]) for n in ordered]


def _runs(ordered: list[tuple[fx.Node, str]]) -> list[tuple[str, list[fx.Node]]]:
    runs: list[tuple[str, list[fx.Node]]] = []
    seen: dict[str, int] = {}
    last = None
    for node, key in ordered:
        if key != last:
            seen[key] = seen.get(key, 0) + 1
            runs.append((key if seen[key] == 1 else f"{key}#{seen[key]}", []))
            last = key
        runs[-1][1].append(node)
    return runs


def _leaf_calls(model: nn.Module, nodes: list[fx.Node]) -> list[tuple[str | None, list[fx.Node]]]:
    """``nodes`` cut into runs, each one call of a torch.nn leaf module (path, its nodes) or one
    other node (None, [node]). A call is told apart from the next call of the same module by its
    ``nn_module_stack`` key, which export numbers per call."""
    modules = dict(model.named_modules())
    out: list[tuple[str | None, list[fx.Node]]] = []
    last_key = None
    for n in nodes:
        stack = n.meta.get("nn_module_stack") or {}
        key, (path, _) = (list(stack.items())[-1] if stack else (None, (None, None)))
        m = modules.get(path) if path else None
        if m is None or next(m.children(), None) is not None or not type(m).__module__.startswith("torch.nn") \
                or isinstance(m, (nn.RNNBase, nn.MultiheadAttention)):
            out.append((None, [n]))
            last_key = None
            continue
        if key == last_key and out:
            out[-1][1].append(n)
        else:
            out.append((path, [n]))
        last_key = key
    return out


def _is_symbolic(n: fx.Node) -> bool:
    """A node whose value is a size (SymInt/SymFloat/SymBool), computed from a dynamic dimension."""
    return isinstance(n.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))


def _size_roots(n: fx.Node) -> list[fx.Node]:
    """The tensors whose sizes the size ``n`` is computed from (the inputs of its ``sym_size``s)."""
    if n.op == "call_function" and n.target is torch.ops.aten.sym_size.int:
        return [n.args[0]]
    return [r for a in n.all_input_nodes if _is_symbolic(a) for r in _size_roots(a)]


def _matching(n: fx.Node, tensors: list[fx.Node]) -> tuple[fx.Node, int] | None:
    """A tensor of ``tensors`` and a dimension whose size is the same symbol as ``n``'s value."""
    expr = n.meta["val"].node.expr
    for t in tensors:
        for d, size in enumerate(getattr(t.meta.get("val"), "shape", ())):
            if isinstance(size, torch.SymInt) and size.node.expr == expr:
                return t, d
    return None


def _symbolic(n: fx.Node, graph: fx.Graph, env: dict, tensors: list[fx.Node]) -> Any:
    """``n``, a size made outside the layer, made again in it: a size equal to one of the layer's
    input tensors' sizes is read off that tensor; otherwise its arithmetic is copied, down to the
    ``sym_size`` of the tensors it came from (which the layer then takes as inputs)."""
    if n in env:
        return env[n]
    match = _matching(n, tensors)
    if match is not None:
        env[n] = graph.call_function(torch.ops.aten.sym_size.int, (env[match[0]], match[1]))
    else:
        env[n] = graph.node_copy(n, lambda a: _symbolic(a, graph, env, tensors) if _is_symbolic(a) else env[a])
    return env[n]


def _outline(model: nn.Module, gm: fx.GraphModule, nodes: list[fx.Node], readers: dict[fx.Node, set]) -> tuple[fx.GraphModule, list[fx.Node], list[fx.Node]]:
    """One layer's GraphModule: (module, the outside nodes it reads in order, the nodes it hands
    on in order). Parameters and buffers are ``gm``'s (the model's own objects)."""
    members = set(nodes)
    graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    inputs: list[fx.Node] = []

    def value(n: fx.Node):
        if n not in env:
            if _is_symbolic(n):  # a size from outside: recomputed here from a tensor the layer has
                return _symbolic(n, graph, env, list(inputs))
            if n.op == "get_attr":
                env[n] = graph.get_attr(str(n.target))
            else:
                inputs.append(n)
                env[n] = graph.placeholder(n.name)
        return env[n]

    # placeholders first, in first-use order
    for n in nodes:
        for src in n.all_input_nodes:
            if src not in members and src.op != "get_attr" and not _is_symbolic(src):
                value(src)
    # then the tensors a size from outside must be read off, where no input has that size
    for n in nodes:
        for src in n.all_input_nodes:
            if src not in members and _is_symbolic(src) and _matching(src, inputs) is None:
                for root in _size_roots(src):
                    if root not in members:
                        value(root)
    # An input the layer updates in place (ResNet's `hidden += residual`, a ReLU(inplace=True)) is
    # cloned first: at a stage boundary it is a leaf that requires grad, which autograd refuses
    # to modify in place, and the sender's copy must stay as it was sent.
    for n in nodes:
        target = n.target
        if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable and n.args \
                and isinstance(n.args[0], fx.Node) and n.args[0] in inputs:
            src = n.args[0]
            env[src] = graph.call_function(torch.ops.aten.clone.default, (env[src],))
    for path, group in _leaf_calls(model, nodes):
        group_set = set(group)
        outside_in = list(dict.fromkeys(s for g in group for s in g.all_input_nodes
                                        if s not in group_set and s.op != "get_attr"))
        handed = [g for g in group if any(u not in group_set for u in g.users)]
        if path is not None and len(outside_in) == 1 and len(handed) == 1 and \
                isinstance(outside_in[0].meta.get("val"), torch.Tensor) and \
                isinstance(handed[0].meta.get("val"), torch.Tensor):
            env[handed[0]] = graph.call_module(path, (value(outside_in[0]),))
            continue
        for n in group:
            env[n] = graph.node_copy(n, value)
    outputs = [n for n in nodes if readers[n] - members and not _is_symbolic(n)]
    graph.output(env[outputs[0]] if len(outputs) == 1 else tuple(env[n] for n in outputs))
    # What the layer uses, by target: get_attr targets are the captured graph's (the model's own
    # parameter and buffer objects), call_module targets the model's own modules.
    owned: dict[str, Any] = {}
    for n in graph.nodes:
        if n.op == "call_module":
            owned[str(n.target)] = model.get_submodule(str(n.target))
    for n in graph.nodes:
        if n.op == "get_attr":
            owned[str(n.target)] = _fetch(gm, str(n.target))
    sub = fx.GraphModule(owned, graph)
    return sub, inputs, outputs


def _fetch(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _attr(name: str, taken: set[str]) -> str:
    base = "".join(c if c.isalnum() else "_" for c in name) or "layer"
    attr, k = base, 1
    while attr in taken or hasattr(fx.GraphModule, attr):  # "forward" is a layer's name, not the method
        k += 1
        attr = f"{base}_{k}"
    taken.add(attr)
    return attr


def capture_layers(model: nn.Module, example_input: Any, layers: Sequence[str] | None = None,
                   dynamic: dict[int, int | None] | None = None) -> LayerGraph:
    """Capture ``model`` on ``example_input``, group its ops into layers (``layers``: module
    paths, else the default granularity) and run the layer graph once on the example.
    ``dynamic``: input dimensions whose size varies (:func:`capture.capture`)."""
    inputs = as_tuple(example_input)
    gm = capture(model, inputs, dynamic)
    keys = layer_keys(model, gm, layers)
    for n in keys:  # a size belongs to no layer: it goes with its first reader (and is remade by others)
        if _is_symbolic(n):
            keys[n] = None
    runs = _runs(_order_and_keys(gm, keys))
    readers: dict[fx.Node, set] = {n: set(n.users) for n in gm.graph.nodes}
    top = fx.Graph()
    root = nn.Module()
    made: dict[fx.Node, Any] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise UntraceableModelError(f"the model's forward takes {len(placeholders)} tensor input(s) but the "
                                    f"example input has {len(inputs)}")
    for n in placeholders:
        made[n] = top.placeholder(n.name)
    taken: set[str] = set()
    names: dict[fx.Node, str] = {}
    for name, nodes in runs:
        sub, ins, outs = _outline(model, gm, nodes, readers)
        for src in ins:
            if src not in made:
                raise UntraceableModelError(f"layer {name!r} reads {src.name!r}, which no earlier layer makes")
        attr = _attr(name, taken)
        root.add_module(attr, sub)
        call = top.call_module(attr, tuple(made[s] for s in ins))
        names[call] = name
        if len(outs) == 1:
            made[outs[0]] = call
        else:
            for i, o in enumerate(outs):
                made[o] = top.call_function(operator.getitem, (call, i))
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    flat = out_node.args[0] if isinstance(out_node.args[0], (tuple, list)) else (out_node.args[0],)
    for item in flat:
        if not isinstance(item, fx.Node) or item not in made:
            raise UntraceableModelError(f"the model returns {item!r}, not a tensor computed from its inputs "
                                        "(return tensors, tuples, dicts or ModelOutputs of tensors)")
    top.output(tuple(made[item] for item in flat))
    top_gm = fx.GraphModule(root, top, type(model).__name__)
    return _layer_graph(model, top_gm, names, inputs, getattr(gm, "_out_spec", None))


def _describe(module: nn.Module) -> str:
    """A leaf module's one-line repr (``Linear(in_features=4, ...)``: its shape matters to a
    reader and to what the runtime batches), a block's class name."""
    if next(module.children(), None) is None:
        return " ".join(repr(module).split())[:200]
    return type(module).__name__


def _layer_graph(model: nn.Module, gm: fx.GraphModule, names: dict[fx.Node, str], inputs: tuple,
                 out_spec) -> LayerGraph:
    values: dict[fx.Node, Any] = {}
    interp = fx.Interpreter(gm)
    env_run = interp.run_node

    def run_node(n):
        try:
            v = env_run(n)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UntraceableModelError(f"running the captured model failed in layer {names.get(n, n.name)!r}: "
                                        f"{first}") from None
        values[n] = v
        return v

    interp.run_node = run_node
    with torch.enable_grad():  # requires_grad of each value says which activations get gradients
        interp.run(*inputs)
    layers: list[LayerNode] = []
    name_of: dict[fx.Node, str] = {}
    helper_of: dict[fx.Node, tuple[list[str], list[fx.Node]]] = {}
    output_slots: list[tuple[str, int | None]] = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            name_of[n] = n.name
            layers.append(LayerNode(n.name, n, "input", desc="Input"))
        elif n.op == "call_module":
            name = names[n]
            name_of[n] = name
            deps, helpers = [], []
            for src in n.all_input_nodes:
                if src in name_of:
                    deps.append(name_of[src])
                else:
                    deps.extend(helper_of[src][0])
                    helpers.extend(helper_of[src][1] + [src])
            paths = tensor_paths(values[n])
            if paths is None:
                raise UntraceableModelError(f"layer {name!r} hands on a value that is not tensors")
            base = name.split("#")[0]
            desc = _describe(model.get_submodule(base)) if base != "forward" else type(model).__name__
            layers.append(LayerNode(name, n, "layer", list(dict.fromkeys(deps)), list(dict.fromkeys(helpers)),
                                    desc=desc, paths=paths if paths != [()] else []))
        elif n.op == "call_function":  # getitem of a layer's tuple
            src = n.args[0]
            helper_of[n] = ([name_of[src]], [])
        elif n.op == "output":
            for item in n.args[0]:
                if item in name_of:
                    output_slots.append((name_of[item], None))
                else:
                    output_slots.append((name_of[item.args[0]], item.args[1]))
    kept = {name_of[layer.node]: detach(values[layer.node]) for layer in layers}
    grads = {name_of[layer.node]: any(t.requires_grad for t in flat_tensors(values[layer.node])) for layer in layers}
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    return LayerGraph(gm=gm, layers=layers, output_slots=output_slots, values=kept, requires_grad=grads,
                      order=order, out_spec=out_spec)
