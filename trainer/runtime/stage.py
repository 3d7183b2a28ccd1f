"""One pipeline stage on one worker: forward, backward, all-reduce and step for its microbatches.

Holds the stage module, its weight versions and optimizer, and what each microbatch in flight
keeps between its forward and backward (inputs and outputs with their autograd graph). The last
stage also owns the loss. Communication is not done here: the executor hands tensors in and out.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from trainer.runtime.versions import WeightVersions


class Stage:
    def __init__(
        self,
        index: int,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        is_first: bool,
        is_last: bool,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
        stash: bool,
        loss_scale: float,
        ddp: nn.Module | None = None,
    ) -> None:
        self.index = index
        self.module = module
        self.ddp = ddp  # DistributedDataParallel wrapper (dp schedule), else None
        self.versions = WeightVersions(module, optimizer, stash)
        # (owning module, attribute, index into a version's tensors) of every parameter slot,
        # tied parameters included (named_parameters lists a shared tensor once)
        index = {id(p): i for i, p in enumerate(self.versions.params)}
        self._slots = [(module.get_submodule(n.rpartition(".")[0]), n.rpartition(".")[2], index[id(p)])
                       for n, p in module.named_parameters(remove_duplicate=False) if id(p) in index]
        self.is_first = is_first
        self.is_last = is_last
        self.loss_fn = loss_fn
        self.loss_scale = loss_scale
        self.in_flight: dict[int, tuple] = {}
        self.losses: list[float] = []  # unscaled training losses of finished forwards (last stage)
        self.eval_outputs: list[torch.Tensor] = []

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.versions.optimizer

    def _call(self, version: int, inputs: list[torch.Tensor], train: bool = True) -> tuple[torch.Tensor, ...]:
        tensors = self.versions.tensors(version)
        if tensors is not None:
            out = self._call_with(tensors, inputs)
        else:
            out = (self.ddp if (train and self.ddp is not None) else self.module)(*inputs)
        return out if isinstance(out, tuple) else (out,)

    def _call_with(self, tensors: list[torch.Tensor], inputs: list[torch.Tensor]):
        """Run the module with its parameter slots holding ``tensors`` for this call only.

        What ``torch.func.functional_call`` does, without its per-call bookkeeping (about a
        millisecond per forward here, a tenth of a small stage's compute): the slots are found
        once and swapped by dictionary assignment."""
        slots = self._slots
        saved = [owner._parameters[name] for owner, name, _ in slots]
        try:
            for owner, name, i in slots:
                owner._parameters[name] = tensors[i]
            return self.module(*inputs)
        finally:
            for (owner, name, _), p in zip(slots, saved):
                owner._parameters[name] = p

    def forward(self, mb: int, version: int, inputs: list[torch.Tensor], target: torch.Tensor | None,
                sync_grads: bool = True) -> tuple[torch.Tensor, ...]:
        if not self.is_first:
            inputs = [x.requires_grad_(True) if x.dtype.is_floating_point else x for x in inputs]
        if self.ddp is not None:
            self.ddp.require_backward_grad_sync = sync_grads
        outputs = self._call(version, inputs)
        if self.is_last:
            loss = self.loss_fn(outputs[0], target)
            self.losses.append(float(loss.detach()))
            self.in_flight[mb] = (inputs, (loss * self.loss_scale,))
            return ()
        self.in_flight[mb] = (inputs, outputs)
        return tuple(o.detach() for o in outputs)

    def backward(self, mb: int, grads: list[torch.Tensor] | None) -> list[torch.Tensor]:
        """Backpropagate microbatch ``mb``; returns the gradients of its floating-point inputs."""
        try:
            inputs, outputs = self.in_flight.pop(mb)
        except KeyError:
            raise RuntimeError(f"stage {self.index}: backward of microbatch {mb} before its forward") from None
        if self.is_last:
            torch.autograd.backward(outputs[0])
        else:
            pairs = [(o, g) for o, g in zip((o for o in outputs if o.dtype.is_floating_point), grads) if o.requires_grad]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        if self.is_first:
            return []
        return [x.grad if x.grad is not None else torch.zeros_like(x) for x in inputs if x.dtype.is_floating_point]

    @torch.no_grad()
    def evaluate(self, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Forward without autograd (validation); the last stage keeps its outputs."""
        outputs = self._call(self.versions.current, inputs, train=False)
        if self.is_last:
            self.eval_outputs.append(outputs[0])
        return outputs

    def allreduce(self, group, average: bool) -> None:
        """Sum (or average) this stage's gradients over its replicas, as one flat buffer."""
        if self.ddp is not None:
            return  # DistributedDataParallel already reduced them during the backward
        grads = self.versions.gather_grads()
        for p, g in zip(self.versions.params, grads):
            if g is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self.versions.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        if average:
            flat /= dist.get_world_size(group)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n

    def step(self, version: int, keep_current: bool) -> None:
        self.versions.step(version, keep_current)
