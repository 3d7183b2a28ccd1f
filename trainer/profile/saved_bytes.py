"""What each layer keeps for its backward: the bytes autograd saves while the layer's forward runs.

A layer's ``activation_bytes`` (its output) is what crosses a cut between stages; what a
microbatch in flight holds until its backward is what autograd saved inside the stage, often many
times more (a transformer block keeps its attention scores and its MLP's hidden activations:
about 10x its output on the zoo's small causal LMs). Counted here as the runtime counts it
(trainer/runtime/memory_predict.py): each storage once over the whole forward, charged to the
first layer that saves it, parameters left out (they are the weights)."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import fx

from pipeboard.trainer.precision import autocast
from pipeboard.trainer.profile.layergraph import LayerGraph


class _Attributing(fx.Interpreter):
    """Runs the layer graph, remembering which layer the node now running belongs to."""

    def __init__(self, lg: LayerGraph, owner: dict[str, str]) -> None:
        super().__init__(lg.gm)
        self.owner = owner
        self.current: str | None = None

    def run_node(self, n: fx.Node) -> Any:
        self.current = self.owner.get(n.name)
        return super().run_node(n)


def saved_bytes(lg: LayerGraph, owner: dict[str, str], inputs: tuple, params: Sequence[torch.Tensor],
                device_type: str, precision: str = "fp32") -> dict[str, int]:
    """Layer name -> bytes autograd saved for its backward in one forward of ``inputs``."""
    weights = {p.untyped_storage().data_ptr() for p in params}
    seen: set[tuple[int, int]] = set()
    out: dict[str, int] = {}
    runner = _Attributing(lg, owner)

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key[0] not in weights and key not in seen and runner.current is not None:
            seen.add(key)
            out[runner.current] = out.get(runner.current, 0) + key[1]
        # detached: no backward runs here, and a saved output holding itself would be a cycle
        # through autograd's graph that outlives the forward
        return t.detach()

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            autocast(device_type, precision):
        runner.run(*inputs)
    return out
