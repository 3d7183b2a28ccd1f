"""The runtime's per-stage memory prediction, by the one formula (trainer/schedule/memory_model.py).

Its inputs are read off the run's own stage modules on one example microbatch, before training:
- one version of each stage's parameters (bytes of their storages, shared ones once);
- what a stage's forward saves for its backward: every tensor autograd packs
  (``saved_tensors_hooks``), each storage once, parameters left out (they are the weights);
- the stage's boundary tensors (its input and its output for one microbatch).
The schedule's own action lists then say how many microbatches and versions each worker keeps;
the optimizer says how many copies of the weights its state holds.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from pipeboard.trainer.precision import autocast
from pipeboard.trainer.schedule.actions import Schedule
from pipeboard.trainer.schedule.memory_model import StageMemory, WorkerMemory, worker_memory
from pipeboard.trainer.tensors import tensors_in


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def optimizer_kind(optimizer: torch.optim.Optimizer | str) -> str:
    """memory_model's optimizer name for a torch optimizer (or a task's optimizer name)."""
    if isinstance(optimizer, str):
        return optimizer
    name = type(optimizer).__name__.lower()
    if name == "sgd":
        return "sgd" if any(g.get("momentum", 0) for g in optimizer.param_groups) else "sgd-plain"
    return name


def measure_stages(modules: Sequence[nn.Module], example, precision: str = "fp32",
                   device_type: str = "cpu", *, loss=None, target=None) -> list[StageMemory]:
    """memory_model inputs of each stage: ``example`` (one microbatch's input) is run through the
    stages in order, counting what a microbatch in flight keeps until its backward. That is more
    than what autograd saves: the runtime's stage holds each microbatch's inputs and outputs until
    the gradient comes back (stage.py's ``in_flight``), and the last stage computes the loss
    outside its module, whose saved tensors (cross-entropy's log-softmax: the logits' size) live
    as long; with ``loss`` and ``target`` (the task's) they are counted. Under recompute a
    microbatch keeps exactly those (inputs, outputs, the loss's), not its input alone. A split
    backward's input-gradient pass (BI) leaves, for the weight pass (W), the gradient of every
    weighted layer's output (dW = g^T x): ``weight_grad_bytes``; and their inputs,
    ``weight_input_bytes`` (among the saved activations without recompute; rebuilt by the BI
    and kept for W with it)."""
    out = []
    xs = [t.detach() for t in tensors_in(example)]
    last = len(modules) - 1
    for index, module in enumerate(modules):
        params = {_storage_key(p) for p in module.parameters()}
        inputs = [t.detach().requires_grad_(True) if (index and t.dtype.is_floating_point) else t for t in xs]
        saved: dict[tuple[int, int], int] = {}
        kept: dict[tuple[int, int], int] = {}  # what recompute keeps: inputs, outputs, the loss's saved

        def pack(t: torch.Tensor, params=params, into=None):
            key = _storage_key(t)
            if key not in params:
                (into if into is not None else saved)[key] = key[1]
            # detached: a saved output holding itself (its grad_fn saves it) is a cycle through
            # autograd's C++ graph that Python's collector cannot see, and no backward frees it here
            return t.detach()

        grads: dict[tuple[int, int], int] = {}  # the output of each weighted layer: its gradient's size
        layer_inputs: dict[tuple[int, int], int] = {}  # and its input (what dW = g^T x reads)

        def weighted_output(mod, args, result, grads=grads, layer_inputs=layer_inputs):
            if any(True for _ in mod.parameters(recurse=False)):
                for t in tensors_in(result):
                    if t.dtype.is_floating_point:
                        grads[_storage_key(t)] = t.numel() * t.element_size()
                for t in tensors_in(list(args)):
                    if t.dtype.is_floating_point:
                        layer_inputs[_storage_key(t)] = t.untyped_storage().nbytes()

        handle = nn.modules.module.register_module_forward_hook(weighted_output)
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(device_type, precision):
                result = module(*inputs)
        finally:
            handle.remove()
        outs = tensors_in(result)
        # the last stage holds its loss, not its outputs (the loss's graph keeps what it saved)
        for t in inputs + (outs if index < last else []):
            key = _storage_key(t)
            if key not in params:
                kept[key] = key[1]
        if index == last and loss is not None and target is not None:
            structure = getattr(module, "structure", None)
            shaped = structure(tuple(outs)) if structure is not None else result
            with torch.autograd.graph.saved_tensors_hooks(lambda t: pack(t, into=kept), lambda t: t), \
                    autocast(device_type, precision):
                loss(shaped, target)
        weights = {_storage_key(p): p.untyped_storage().nbytes() for p in module.parameters()}
        out.append(StageMemory(weight_bytes=sum(weights.values()), activation_bytes=sum({**saved, **kept}.values()),
                               input_bytes=_bytes(inputs),  # held per microbatch in flight (stage 0: the data)
                               output_bytes=_bytes(outs) if index < last else 0,
                               recompute_bytes=sum(kept.values()), weight_grad_bytes=sum(grads.values()),
                               weight_input_bytes=sum(layer_inputs.values())))
        xs = [t.detach() for t in outs]
    return out


def predict_workers(schedule: Schedule, stages: list[StageMemory], optimizer: torch.optim.Optimizer | str,
                    recompute: Sequence[int] = ()) -> list[WorkerMemory]:
    """Per worker of ``schedule`` (one batch's action lists): memory_model's peak, by part."""
    return worker_memory(schedule, stages, optimizer=optimizer_kind(optimizer), recompute=recompute)


def predicted_bytes_per_stage(schedule: Schedule, stages: list[StageMemory], optimizer: torch.optim.Optimizer | str,
                              recompute: Sequence[int] = ()) -> dict[int, int]:
    """Virtual stage -> predicted peak bytes of the worker process holding it (the figure a
    run's per-stage ``memory`` entry measures; a stage's replicas hold the same)."""
    workers = predict_workers(schedule, stages, optimizer, recompute)
    out: dict[int, int] = {}
    for spec, w in zip(schedule.workers, workers):
        for s in spec.stages:
            out[s] = max(out.get(s, 0), w.total)
    return out
