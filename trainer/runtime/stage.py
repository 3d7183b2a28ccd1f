"""One pipeline stage on one worker: forward, backward, all-reduce and step for its microbatches.

Holds the stage module, its weight versions and optimizer, and what each microbatch in flight
keeps between its forward and backward (inputs and outputs with their autograd graph). The last
stage also owns the loss. Communication is not done here: the executor hands tensors in and out.

A backward may be split (zero-bubble style, or to batch weight gradients): ``backward(mb, grads,
weights=False)`` computes the input gradients only and leaves the microbatch's weight gradients
pending; ``backward_weight(mb)`` (or ``-1``: every pending microbatch at once) computes them. See
``weightgrad.py`` for how.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from pipeboard.trainer.runtime.memory_count import counter
from pipeboard.trainer.runtime.versions import WeightVersions
from pipeboard.trainer.runtime.weightgrad import CallRecorder, PendingWeights, backward_inputs, backward_weights, get_attr_slots


@dataclass(eq=False)
class _Replay:
    """What a recomputing stage's W needs after its BI: it reruns the forward from the inputs
    (under the forward's random state) and takes the weight gradients in one backward. Taking
    them layer by layer through the checkpointed graph would replay the whole stage once per
    layer and keep every replay's tensors until the graph went."""

    inputs: list[torch.Tensor]
    grads: list[torch.Tensor] | None  # the output gradients BI received (None: the last stage)
    rng: tuple
    target: torch.Tensor | None


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
        layer_calls: bool = True,
        autocast: Callable[[], object] = nullcontext,
        recompute: bool = False,
    ) -> None:
        self.index = index
        # activation recompute: the forward keeps only its inputs; the backward reruns it
        # (torch.utils.checkpoint, non-reentrant) against the same weight version's tensors
        self.recompute = recompute
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
        self.autocast = autocast  # a fresh context per forward (the run's precision)
        self.in_flight: dict[int, tuple] = {}
        # Weight-gradient split: calls noted per forward, and W work left by BI per microbatch
        # (with the tensors of the version it ran against). DDP reduces inside its own backward:
        # never split.
        # ``layer_calls=False`` saves the hooks' cost where no backward will be split: a few percent
        # of a small microbatch's forward (docs/runtime.md, "Executing actions").
        self._recorder = CallRecorder(module) if ddp is None and layer_calls else None
        read = set(get_attr_slots(module))
        self._get_attr_params = {i for owner, name, i in self._slots if (owner, name) in read}
        self.pending_weights: dict[int, tuple[list[torch.Tensor], PendingWeights]] = {}
        # unscaled training losses of finished forwards (last stage), kept as tensors: reading one
        # is a host sync on a GPU, so the step report reads them together (instrument.StepReports)
        self.losses: list[torch.Tensor] = []
        self.eval_outputs: list[torch.Tensor] = []
        # called with this stage right before each update (tied parameters: trainer/runtime/tied.py)
        self.before_step: Callable[[Stage], None] | None = None
        # On CPU the worker's memory is counted in tensors' bytes (memory_count.py): storages this
        # stage keeps per microbatch, from its forward to its backward (or from BI to W)
        first = next(iter(module.parameters()), None)
        self.counter = counter() if first is None or first.device.type == "cpu" else None
        self._held: dict[int, list] = {}
        self._held_w: dict[int, list] = {}
        self._rebuilding = False
        self._rng: dict[int, tuple] = {}  # recompute: each microbatch's random state and target, for W
        self._device = first.device if first is not None else torch.device("cpu")
        if self.counter is not None:
            self.counter.stages.add(self)
            self.counter.refresh()

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.versions.optimizer

    def _call(self, version: int, inputs: list[torch.Tensor], train: bool = True) -> tuple[torch.Tensor, ...]:
        tensors = self.versions.tensors(version)
        if tensors is not None:
            out = self._call_with(tensors, inputs)
        else:
            out = self._module_call(self.ddp if (train and self.ddp is not None) else self.module, inputs)
        return out if isinstance(out, tuple) else (out,)

    def _module_call(self, module, inputs):
        if self._rebuilding and self.counter is not None:  # recompute's replay inside a backward
            with self.counter.rebuilding():
                return module(*inputs)
        return module(*inputs)

    def _counting(self):
        return self.counter.hooks() if self.counter is not None else nullcontext()

    def _structured(self, outputs: tuple[torch.Tensor, ...]):
        """What the model itself returns (a tensor, tuple, dict, ModelOutput), as the loss expects."""
        structure = getattr(self.module, "structure", None)
        if structure is not None:
            return structure(outputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def _call_with(self, tensors: list[torch.Tensor], inputs: list[torch.Tensor]):
        """Run the module with its parameter slots holding ``tensors`` for this call only.

        What ``torch.func.functional_call`` does, without its per-call bookkeeping (a sizeable share
        of a small stage's compute; docs/runtime.md, "Weight stashing without in-place swaps"): the
        slots are found once and swapped by dictionary assignment."""
        slots = self._slots
        saved = [owner._parameters[name] for owner, name, _ in slots]
        try:
            for owner, name, i in slots:
                owner._parameters[name] = tensors[i]
            return self._module_call(self.module, inputs)
        finally:
            for (owner, name, _), p in zip(slots, saved):
                owner._parameters[name] = p

    def forward(self, mb: int, version: int, inputs: list[torch.Tensor], target: torch.Tensor | None,
                sync_grads: bool = True) -> tuple[torch.Tensor, ...]:
        if not self.is_first:
            inputs = [x.requires_grad_(True) if x.dtype.is_floating_point else x for x in inputs]
        if self.ddp is not None:
            self.ddp.require_backward_grad_sync = sync_grads
        if self._recorder is not None:
            self._recorder.start()
        if self.recompute and self._recorder is not None:  # a split backward may follow
            cuda = self._device.type == "cuda"
            self._rng[mb] = (torch.get_rng_state(), torch.cuda.get_rng_state(self._device) if cuda else None, target)
        try:
            with self.autocast(), self._counting():
                if self.recompute:
                    outputs = checkpoint(self._call, version, inputs, use_reentrant=False)
                else:
                    outputs = self._call(version, inputs)
                if self.is_last:
                    loss = self.loss_fn(self._structured(outputs), target)
        finally:
            calls = self._recorder.stop() if self._recorder is not None else []
        if self.recompute:
            calls = []  # the notes would keep what recompute frees (a Linear's input); W replays instead
        if self.is_last:
            self.losses.append(loss.detach())
            with self._counting():
                outputs = (loss * self.loss_scale,)
        self.in_flight[mb] = (inputs, outputs, calls, version)
        if self.counter is not None:
            self._held[mb] = self.counter.hold([*inputs, *outputs, *(c.x for c in calls)])
        return () if self.is_last else tuple(o.detach() for o in outputs)

    def backward(self, mb: int, grads: list[torch.Tensor] | None, weights: bool = True) -> list[torch.Tensor]:
        """Backpropagate microbatch ``mb``; returns the gradients of its floating-point inputs.
        ``weights=False``: input gradients only (BI); the weight gradients wait for
        ``backward_weight``."""
        try:
            inputs, outputs, calls, version = self.in_flight.pop(mb)
        except KeyError:
            raise RuntimeError(f"stage {self.index}: backward of microbatch {mb} before its forward") from None
        # the received output gradient is memory this stage holds while its backward runs (the
        # boundary buffer memory_model predicts); a split backward's W notes keep it longer
        got_grads = self.counter.hold(grads or []) if self.counter is not None else []
        self._rebuilding = self.recompute
        try:
            if not weights:
                got = self._backward_inputs(mb, inputs, outputs, grads, calls, version)
            else:
                del calls  # the full backward needs no notes
                self._rng.pop(mb, None)
                got = self._backward_full(inputs, outputs, grads)
        finally:
            self._rebuilding = False
        if self.counter is not None:
            if not weights:  # what W reads: each noted layer's input and output gradient, or a replay's
                pending = self.pending_weights[mb][1]
                self._held_w[mb] = self.counter.hold(
                    [*pending.inputs, *(pending.grads or ())] if isinstance(pending, _Replay)
                    else [t for c in pending.calls for t in (c.x, *c.grads)])
            self.counter.drop(self._held.pop(mb, []))
            del inputs, outputs
            self.counter.end_backward()
            self.counter.drop(got_grads)
            self.counter.refresh()
        return got

    def _backward_full(self, inputs, outputs, grads) -> list[torch.Tensor]:
        if self.is_last:
            torch.autograd.backward(outputs[0])
        else:
            pairs = [(o, g) for o, g in zip((o for o in outputs if o.dtype.is_floating_point), grads) if o.requires_grad]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        if self.is_first:
            return []
        return [x.grad if x.grad is not None else torch.zeros_like(x) for x in inputs if x.dtype.is_floating_point]

    def _backward_inputs(self, mb: int, inputs, outputs, grads, calls, version: int) -> list[torch.Tensor]:
        if self.recompute and mb in self._rng:
            return self._replayed_inputs(mb, inputs, outputs, grads, version)
        if self._recorder is None:
            raise RuntimeError(f"stage {self.index}: a split backward (BI/W) needs the layer calls noted during the "
                               "forward (not with DistributedDataParallel, nor layer_calls=False)")
        if mb in self.pending_weights:
            raise RuntimeError(f"stage {self.index}: microbatch {mb} already awaits its weight gradients")
        if self.is_last:
            roots, root_grads = [outputs[0]], None
        else:
            pairs = [(o, g) for o, g in zip((o for o in outputs if o.dtype.is_floating_point), grads) if o.requires_grad]
            roots, root_grads = [o for o, _ in pairs], [g for _, g in pairs]
        wanted = [] if self.is_first else [x for x in inputs if x.dtype.is_floating_point]
        needs = [x for x in wanted if x.requires_grad]
        tensors = self.versions.tensors(version) or self.versions.params
        covered = {id(p) for c in calls for p in c.params}
        # Parameters no hooked call accounts for get their gradients here, the plain way.
        eager = [t for i, t in enumerate(tensors) if id(t) not in covered or i in self._get_attr_params]
        got, pending = ([], PendingWeights([], set())) if not roots else backward_inputs(roots, root_grads, needs, calls, eager)
        self.pending_weights[mb] = (tensors, pending)
        by_id = {id(x): g for x, g in zip(needs, got)}
        return [g if (g := by_id.get(id(x))) is not None else torch.zeros_like(x) for x in wanted]

    def _replayed_inputs(self, mb: int, inputs, outputs, grads, version: int) -> list[torch.Tensor]:
        """BI of a recomputing stage: the input gradients through the checkpointed graph, which
        goes with them; W replays the forward itself (``_Replay``)."""
        if mb in self.pending_weights:
            raise RuntimeError(f"stage {self.index}: microbatch {mb} already awaits its weight gradients")
        cpu_rng, cuda_rng, target = self._rng.pop(mb)
        wanted = [] if self.is_first else [x for x in inputs if x.dtype.is_floating_point]
        needs = [x for x in wanted if x.requires_grad]
        if self.is_last:
            roots, root_grads = [outputs[0]], None
        else:
            pairs = [(o, g) for o, g in zip((o for o in outputs if o.dtype.is_floating_point), grads) if o.requires_grad]
            roots, root_grads = [o for o, _ in pairs], [g for _, g in pairs]
        got = torch.autograd.grad(roots, needs, root_grads, allow_unused=True) if roots and needs else []
        tensors = self.versions.tensors(version) or self.versions.params
        self.pending_weights[mb] = (tensors, _Replay([x.detach() for x in inputs], None if self.is_last else list(grads),
                                                     (cpu_rng, cuda_rng, version), target))
        by_id = {id(x): g for x, g in zip(needs, got)}
        return [g if (g := by_id.get(id(x))) is not None else torch.zeros_like(x) for x in wanted]

    def _replay_weights(self, tensors: list[torch.Tensor], r: _Replay) -> None:
        cpu_rng, cuda_rng, _ = r.rng
        devices = [self._device] if cuda_rng is not None else []
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state(cuda_rng, self._device)
            with self.autocast(), self._counting():
                # the version's own tensors: it may have been released since the BI
                outputs = self._call_with(tensors, list(r.inputs)) if self.versions.stash else self.module(*r.inputs)
                outputs = outputs if isinstance(outputs, tuple) else (outputs,)
                if self.is_last:
                    roots, root_grads = [self.loss_fn(self._structured(outputs), r.target) * self.loss_scale], None
                else:  # paired as the backward pairs them
                    pairs = [(o, g) for o, g in zip((o for o in outputs if o.dtype.is_floating_point), r.grads)
                             if o.requires_grad]
                    roots, root_grads = [o for o, _ in pairs], [g for _, g in pairs]
            targets = [t for t in tensors if t.requires_grad]
            if not targets or not roots:  # a stage without weights (or no output reached the loss)
                return
            got = torch.autograd.grad(roots, targets, root_grads, allow_unused=True)
        for t, g in zip(targets, got):
            if g is not None:
                t.grad = g if t.grad is None else t.grad.add_(g)

    def backward_weight(self, mb: int) -> None:
        """Weight gradients of microbatch ``mb``'s earlier BI, or with ``mb == -1`` of every
        microbatch awaiting them (batched where the layer allows). They accumulate into the
        ``.grad`` of the tensors the forward ran with, as the full backward's would."""
        if mb == -1:
            todo = list(self.pending_weights.items())
            self.pending_weights.clear()
        else:
            try:
                todo = [(mb, self.pending_weights.pop(mb))]
            except KeyError:
                raise RuntimeError(f"stage {self.index}: weight gradients of microbatch {mb} before its "
                                   "input-gradient backward") from None
        if not todo:
            return
        # without grad mode: g^T x of a Linear's noted input would otherwise record a graph on the
        # weight's gradient, which then kept every microbatch's activations until the update
        with torch.no_grad():
            backward_weights([pending for _, (_, pending) in todo if not isinstance(pending, _Replay)])
        for m, (tensors, pending) in todo:
            if isinstance(pending, _Replay):  # one microbatch's replay at a time
                self._replay_weights(tensors, pending)
            if self.counter is not None:
                self.counter.drop(self._held_w.pop(m, []))
                self.counter.end_backward()
        if self.counter is not None:
            self.counter.refresh()
        if self.versions.stash:
            # A version released since its BI has had its gradients moved to the parameters
            # already; these late ones follow the same way.
            live = {id(v) for v in self.versions.views.values()}
            done = {id(t): t for _, (t, _) in todo}
            for key, tensors in done.items():
                if key not in live:
                    self.versions.move_grads(tensors)

    @torch.no_grad()
    def evaluate(self, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Forward without autograd (validation); the last stage keeps its outputs."""
        with self.autocast():
            outputs = self._call(self.versions.current, inputs, train=False)
        if self.is_last:
            self.eval_outputs.append(outputs[0])
        return outputs

    def allreduce(self, group) -> None:
        """Sum this stage's gradients over its replicas, as one flat buffer (each microbatch's loss
        is already scaled by 1/M, so the sum is the batch's mean gradient)."""
        if self.ddp is not None:
            return  # DistributedDataParallel already reduced them during the backward
        grads = self.versions.gather_grads()
        for p, g in zip(self.versions.params, grads):
            if g is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self.versions.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n

    def step(self, version: int, keep_current: bool) -> None:
        if self.pending_weights:
            raise RuntimeError(f"stage {self.index}: update with the weight gradients of microbatch(es) "
                               f"{sorted(self.pending_weights)} still pending (a W must come before it)")
        if self.before_step is not None:
            self.before_step(self)
        grads = self.counter.refresh() if self.counter is not None else 0
        self.versions.step(version, keep_current)
        if self.counter is not None:
            # the new optimizer state and version were made while the gradients still existed
            self.counter.refresh()
            self.counter.note(extra=grads)
