"""Which layer each op of a captured model belongs to: a module path, from its ``nn_module_stack``.

The planner splits between layers, so a layer should be a unit a user recognises and a plan can
balance: a model's blocks. Three ways to say which modules are layers:

- **Named** (``Task(layers=[...])``): each listed module path is one layer; an op runs in the
  outermost listed module on its stack. A path the model lacks, or one the forward never calls,
  is an error naming it.
- **Default, a repeated stack**: the children of the model's ``ModuleList``/``Sequential``
  containers of two or more modules of one type (transformer blocks, residual blocks), plus every
  module beside the path down to them (embeddings before, norm and head after). Only the
  outermost such containers count (a Mixtral's decoder layers, not the experts inside each; a
  ResNet's stages, not the convolutions inside each block); among them the block type with the
  most instances wins, every container of it counting (T5's encoder and decoder blocks).
- **Default, no stack**: one layer per leaf module (a module without children).

An op in no layer's module (glue in a forward between modules: a reshape, a mask, a residual
add in the model's own forward) gets no key here; :mod:`outline` puts it in the layer of its
first consumer, so it is computed where it is used instead of crossing a stage boundary as an
extra tensor (a causal mask built once for every block does cross, once, as the first block's
input).
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from torch import fx, nn

from pipeboard.trainer.profile.capture import UntraceableModelError


def module_paths(node: fx.Node) -> list[str]:
    """The module paths ``node`` ran under, outermost first (the model itself is ``""``)."""
    stack = node.meta.get("nn_module_stack") or {}
    return [path for path, _ in stack.values()]


def repeated_stacks(model: nn.Module) -> list[str]:
    """Paths of the containers whose children are the model's repeated blocks (see the module
    docstring); empty when nothing repeats."""
    by_type: dict[type, list[str]] = {}
    for path, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(module.children())
        kinds = {type(c) for c in children}
        if len(children) >= 2 and len(kinds) == 1:
            by_type.setdefault(kinds.pop(), []).append(path)
    if not by_type:
        return []
    every = [p for paths in by_type.values() for p in paths]
    # outermost only: a container inside another container's block is part of that block
    by_type = {kind: kept for kind, paths in by_type.items()
               if (kept := [p for p in paths if not any(p != q and p.startswith(q + ".") for q in every)])}
    counts = Counter({kind: sum(len(model.get_submodule(p)) for p in paths) for kind, paths in by_type.items()})
    best = counts.most_common(1)[0][0]
    return by_type[best]


def _ancestors(paths: Sequence[str]) -> set[str]:
    out = {""}
    for path in paths:
        parts = path.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def layer_keys(model: nn.Module, gm: fx.GraphModule, layers: Sequence[str] | None = None) -> dict[fx.Node, str | None]:
    """Every op node of ``gm`` (captured from ``model``) -> the module path of its layer, or None
    for an op outside every layer's module."""
    ops = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    if layers is not None:
        return _named(model, ops, layers)
    stacks = repeated_stacks(model)
    if stacks:
        inner = _ancestors(stacks)
        return {n: next((p for p in module_paths(n) if p not in inner), None) for n in ops}
    leaves = {path for path, m in model.named_modules() if path and next(m.children(), None) is None}
    return {n: (paths[-1] if (paths := module_paths(n)) and paths[-1] in leaves else None) for n in ops}


def _named(model: nn.Module, ops: list[fx.Node], layers: Sequence[str]) -> dict[fx.Node, str | None]:
    if isinstance(layers, str) or not layers:
        raise UntraceableModelError("layers: must be a non-empty list of module paths (e.g. 'model.layers.0')")
    known = dict(model.named_modules())
    for path in layers:
        if not isinstance(path, str) or path not in known or path == "":
            raise UntraceableModelError(
                f"layers: {type(model).__name__} has no module {path!r} (its modules: "
                f"{', '.join(list(p for p in known if p)[:8])}{', ...' if len(known) > 9 else ''})")
    named = set(layers)
    keys = {n: next((p for p in module_paths(n) if p in named), None) for n in ops}
    used = set(keys.values())
    unused = [p for p in layers if p not in used]
    if unused:
        raise UntraceableModelError(f"layers: module {unused[0]!r} runs no op in the model's forward "
                                    "(or only inside another listed module)")
    return keys
