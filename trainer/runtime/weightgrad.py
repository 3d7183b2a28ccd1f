"""Split a stage's backward into input gradients (BI) and weight gradients (W).

During a forward, a hook on every module that owns parameters notes, per call, the parameter
tensors the call ran with (a stashed version's tensors, or the module's own parameters), the
autograd edge of its output(s) and, for ``nn.Linear``, its input. BI then runs one
``torch.autograd.grad`` from the stage's outputs to the stage's inputs *and* those output edges,
without asking for any parameter: autograd runs the input-gradient chain once, hands over each
layer's output gradient on the way, and skips every weight-gradient computation (no
``AccumulateGrad`` is reached, so nodes like ``addmm`` skip their weight branch).

W turns the noted output gradients into weight gradients:

- ``nn.Linear``: ``dW = g^T x`` and ``db = sum(g)``, with the rows of every pending microbatch
  concatenated into one matmul, whatever weight version each ran against (on small
  microbatches a per-microbatch ``g^T x`` writes a full weight-sized output each time:
  memory-bound);
- any other parameterised layer: ``torch.autograd.grad`` from that call's output edge to its own
  parameters, per microbatch (only the layer's weight branch runs; the graph is kept from BI).

Gradients are accumulated into the ``.grad`` of the tensors a forward used, as the full backward's
``AccumulateGrad`` would (a batched Linear's: those of its first microbatch; the step adds every
version's gradients up anyway). Parameters the hooks cannot attribute to one module call
(read through an fx ``get_attr``, or owned by a module that never ran as itself) get their
gradients in BI, the plain way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import fx, nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from pipeboard.trainer.tensors import tensors_in


@dataclass(eq=False, slots=True)
class LayerCall:
    """One call of a parameterised module during one forward (made on every layer call: slots and
    no default factory keep that cheap)."""

    module: nn.Module
    names: list[str]  # the module's own parameter slots ...
    params: list[torch.Tensor]  # ... and the tensors they held during the call
    edges: list[GradientEdge]  # where the gradient of each differentiable output arrives
    x: torch.Tensor | None = None  # nn.Linear only: its input, for g^T x
    x_version: int = 0
    grads: list[torch.Tensor | None] = ()  # set by BI, per edge

    @property
    def linear(self) -> bool:
        return self.x is not None


@dataclass(eq=False)
class PendingWeights:
    """What W needs for one microbatch after its BI."""

    calls: list[LayerCall]
    skip: set[int]  # ids of tensors whose gradients BI already produced


def _is_plain_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward


def get_attr_slots(module: nn.Module) -> list[tuple[nn.Module, str]]:
    """(owner, attribute) of every parameter an fx graph inside ``module`` reads with
    ``get_attr``: such a read is no module call, so no hook sees it."""
    slots = []
    for gm in module.modules():
        if not isinstance(gm, fx.GraphModule):
            continue
        for node in gm.graph.nodes:
            if node.op != "get_attr":
                continue
            owner_path, _, name = str(node.target).rpartition(".")
            owner = gm.get_submodule(owner_path)
            if name in owner._parameters:
                slots.append((owner, name))
    return slots


class CallRecorder:
    """Forward hooks on the parameterised modules of a stage; ``start``/``stop`` bracket one
    forward and return the calls it made.

    A hook runs on every layer call of every forward, so what it can know in advance (a module's
    parameter names, whether it is a plain Linear) is worked out once here, and per call it only
    reads the tensors in the slots and the output's autograd edge (attribute lookups through
    ``nn.Module.__getattr__`` and generic checks were a large part of the first version's cost per
    call; docs/runtime.md, "Executing actions", has the figures)."""

    def __init__(self, module: nn.Module) -> None:
        self._calls: list[LayerCall] | None = None
        self._handles = []
        for m in module.modules():
            names = [n for n, p in m._parameters.items() if p is not None and p.requires_grad]
            if names:
                weight = names.index("weight") if _is_plain_linear(m) and "weight" in names else -1
                self._handles.append(m.register_forward_hook(partial(self._hook, names, weight)))

    def start(self) -> None:
        self._calls = [] if torch.is_grad_enabled() else None

    def stop(self) -> list[LayerCall]:
        calls, self._calls = self._calls, None
        return calls or []

    def remove(self) -> None:
        for h in self._handles:
            h.remove()

    def _hook(self, names: list[str], weight: int, module: nn.Module, args, output) -> None:
        """``names``: the module's trainable parameter slots when hooked; ``weight``: the index of
        a plain Linear's weight among them, else -1."""
        calls = self._calls
        if calls is None:
            return
        slots = module._parameters
        params = [slots[n] for n in names]
        if not all(p is not None and p.requires_grad for p in params):  # a slot emptied or frozen since
            kept = [(n, p) for n, p in zip(names, params) if p is not None and p.requires_grad]
            if not kept:
                return
            names, params, weight = [n for n, _ in kept], [p for _, p in kept], -1
        outs = [output] if isinstance(output, torch.Tensor) else tensors_in(output)
        outs = [o for o in outs if o.grad_fn is not None]
        if not outs:
            return
        call = LayerCall(module, names, params, [_edge(o) for o in outs])
        if weight >= 0 and len(args) == 1 and len(outs) == 1:
            x = args[0]
            if isinstance(x, torch.Tensor) and x.dtype == params[weight].dtype == outs[0].dtype:
                call.x, call.x_version = x, x._version
        calls.append(call)


_new_tuple = tuple.__new__


def _edge(t: torch.Tensor) -> GradientEdge:
    """``get_gradient_edge`` of a tensor that has a ``grad_fn``, without its generic checks; a
    Python-defined node (autograd.Function) takes the full path, which keeps its graph alive."""
    fn = t.grad_fn
    if isinstance(fn, torch._C._FunctionBase):
        return get_gradient_edge(t)
    return _new_tuple(GradientEdge, (fn, t.output_nr, None))  # not the NamedTuple's slower Python __new__


def backward_inputs(roots: list[torch.Tensor], root_grads: list[torch.Tensor] | None,
                    inputs: list[torch.Tensor], calls: list[LayerCall],
                    eager: list[torch.Tensor]) -> tuple[list[torch.Tensor | None], PendingWeights]:
    """BI: gradients of ``inputs``, each call's output gradients noted for W, and the
    gradients of ``eager`` parameters accumulated now (W skips those)."""
    edges = [e for c in calls for e in c.edges]
    wanted = [get_gradient_edge(x) for x in inputs] + edges + [get_gradient_edge(t) for t in eager]
    # Only non-Linear layers need the graph again in W (Linear keeps its own input).
    retain = any(not c.linear for c in calls)
    got = torch.autograd.grad(roots, wanted, root_grads, retain_graph=retain, allow_unused=True) if wanted else []
    n_in, pos = len(inputs), len(inputs)
    kept = []
    for c in calls:
        c.grads = list(got[pos:pos + len(c.edges)])
        pos += len(c.edges)
        if any(g is not None for g in c.grads):
            kept.append(c)
            if c.linear:
                c.edges = []  # W needs only x and g: let the graph go
        else:  # its output does not reach the loss: no gradient, as in the full backward
            c.grads = []
    for t, g in zip(eager, got[pos:]):
        if g is not None:
            _accumulate(t, g)
    return list(got[:n_in]), PendingWeights(kept, {id(t) for t in eager})


def backward_weights(pending: list[PendingWeights]) -> None:
    """W for the given microbatches: each Linear layer batched over all of them, the rest one
    microbatch at a time."""
    # All calls of one Linear share one matmul, whichever weight version each ran against: a
    # Linear's weight gradient g^T x does not read the weights (the version shaped g and x in BI),
    # and every gradient of one W(-1) goes to the same update. One matmul and one gradient
    # tensor, where a group per version wrote one per version and added them up at the step
    # (pipedream: 2 versions per batch on the first stage).
    groups: dict[tuple, list[tuple[LayerCall, set[int]]]] = {}
    for pw in pending:
        for c in pw.calls:
            if c.linear:
                key = (id(c.module), *c.names)
                groups.setdefault(key, []).append((c, pw.skip))
            else:
                _generic_weights(c, pw.skip)
    for members in groups.values():
        _linear_weights([c for c, _ in members], members[0][1])
    for pw in pending:
        for c in pw.calls:
            c.grads, c.edges, c.x = [], [], None  # free activations and graph as early as possible
        pw.calls = []


def _linear_weights(calls: list[LayerCall], skip: set[int]) -> None:
    # The gradient lands on the tensors the first call ran with (a stashed version's, not what the
    # slots hold now); whether a slot's gradient came in BI (``skip``) is the same for every version.
    role = dict(zip(calls[0].names, calls[0].params))
    w_t, b_t = role.get("weight"), role.get("bias")
    xs, gs = [], []
    for c in calls:
        if c.x._version != c.x_version:
            raise RuntimeError(f"{type(c.module).__name__}: its input was modified in place after the forward; "
                               "the weight gradient cannot be computed")
        g = c.grads[0]
        if g is None:
            continue
        xs.append(c.x.reshape(-1, c.x.shape[-1]))
        gs.append(g.reshape(-1, g.shape[-1]))
    if not gs:
        return
    x = xs[0] if len(xs) == 1 else torch.cat(xs)
    g = gs[0] if len(gs) == 1 else torch.cat(gs)
    if w_t is not None and id(w_t) not in skip:
        if w_t.grad is None:
            w_t.grad = g.t().mm(x)
        else:
            w_t.grad.addmm_(g.t(), x)
    if b_t is not None and id(b_t) not in skip:
        _accumulate(b_t, g.sum(0))


def _generic_weights(call: LayerCall, skip: set[int]) -> None:
    targets = [p for p in call.params if id(p) not in skip]
    pairs = [(e, g) for e, g in zip(call.edges, call.grads) if g is not None]
    if not targets or not pairs:
        return
    got = torch.autograd.grad([e for e, _ in pairs], targets, [g for _, g in pairs],
                              retain_graph=True, allow_unused=True)
    for t, g in zip(targets, got):
        if g is not None:
            _accumulate(t, g)


def _accumulate(t: torch.Tensor, g: torch.Tensor) -> None:
    if t.grad is None:
        t.grad = g.detach()
    else:
        t.grad.add_(g)
