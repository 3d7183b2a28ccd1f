"""What each layer keeps for its backward: the bytes autograd saves while the layer's forward runs.

A layer's ``activation_bytes`` (its output) is what crosses a cut between stages; what a
microbatch in flight holds until its backward is what autograd saved inside the stage, often many
times more (a transformer block keeps its attention scores and its MLP's hidden activations:
about 10x its output on the zoo's small causal LMs). Counted here as the runtime counts it
(trainer/runtime/memory_predict.py): each storage once over the whole forward, charged to the
first layer that saves it, parameters left out (they are the weights).

Also per layer, what a split backward keeps from its input-gradient pass (BI) to its weight pass
(W): the gradient of every output an op with a parameter operand computes (dW = g^T x reads it),
the size of those outputs."""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import torch
from torch import fx

from pipeboard.trainer.precision import autocast
from pipeboard.trainer.profile.layergraph import LayerGraph
from pipeboard.trainer.tensors import tensors_in


class LayerBytes(NamedTuple):
    saved: int  # autograd's saved tensors, each storage once
    weight_grad: int  # outputs of ops with a parameter operand: their gradients wait for W
    weight_input: int  # those ops' other inputs (x of dW = g^T x), each storage once


class _Attributing(fx.Interpreter):
    """Runs the layer graph, remembering which layer the node now running belongs to, and adding
    up the outputs of ops that read a parameter."""

    def __init__(self, lg: LayerGraph, owner: dict[str, str], weights: set[int]) -> None:
        super().__init__(lg.gm)
        self.owner = owner
        self.weights = weights
        self.current: str | None = None
        self.weight_grad: dict[str, int] = {}
        self.weight_input: dict[str, int] = {}
        self._inputs_seen: set[tuple[int, int]] = set()

    def weighted(self, args: Any, result: Any) -> None:
        """An op or module with a parameter operand ran: its output's gradient and its other
        inputs wait for the weight pass."""
        name = self.current
        self.weight_grad[name] = self.weight_grad.get(name, 0) + sum(
            t.numel() * t.element_size() for t in tensors_in(result)
            if t.is_floating_point() and t.requires_grad and t.untyped_storage().data_ptr() not in self.weights)
        for t in tensors_in(args):
            storage = t.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            if t.is_floating_point() and key[0] not in self.weights and key not in self._inputs_seen:
                self._inputs_seen.add(key)
                self.weight_input[name] = self.weight_input.get(name, 0) + key[1]

    def run_node(self, n: fx.Node) -> Any:
        self.current = self.owner.get(n.name)
        value = super().run_node(n)
        if n.op == "call_function" and self.current is not None:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            if any(t.untyped_storage().data_ptr() in self.weights for t in tensors_in((args, kwargs))):
                self.weighted((args, kwargs), value)
        return value


def layer_bytes(lg: LayerGraph, owner: dict[str, str], inputs: tuple, params: Sequence[torch.Tensor],
                device_type: str, precision: str = "fp32") -> dict[str, LayerBytes]:
    """Layer name -> what one forward of ``inputs`` left it holding for the backward."""
    weights = {p.untyped_storage().data_ptr() for p in params}
    seen: set[tuple[int, int]] = set()
    out: dict[str, int] = {}
    runner = _Attributing(lg, owner, weights)

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key[0] not in weights and key not in seen and runner.current is not None:
            seen.add(key)
            out[runner.current] = out.get(runner.current, 0) + key[1]
        # detached: no backward runs here, and a saved output holding itself would be a cycle
        # through autograd's graph that outlives the forward
        return t.detach()

    def weighted_module(module: torch.nn.Module, args: Any, result: Any) -> None:
        # a module with parameters of its own inside a layer the graph calls whole
        if runner.current is not None and any(True for _ in module.parameters(recurse=False)):
            runner.weighted(args, result)

    handle = torch.nn.modules.module.register_module_forward_hook(weighted_module)
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                autocast(device_type, precision):
            runner.run(*inputs)
    finally:
        handle.remove()
    names = set(out) | set(runner.weight_grad) | set(runner.weight_input)
    return {name: LayerBytes(out.get(name, 0), runner.weight_grad.get(name, 0), runner.weight_input.get(name, 0))
            for name in names}
