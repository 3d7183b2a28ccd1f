"""Microbatches in one global order that every worker can reproduce on its own.

Global microbatch ``g`` is part ``g % M`` of training step ``g // M``; step ``k`` is batch
``k % steps_per_epoch`` of epoch ``k // steps_per_epoch`` in the task's seeded order
(``pipeboard.trainer.task.loading``). The first stage takes the inputs, the last stage the targets: both
read the same batches through their own DataLoader, and nobody ships data between workers. That
keeps targets off every boundary and out of the schedule; the last stage reads targets alone where
the data set can give them (``target(index)``), else whole items; loader workers overlap the
reads with compute. Requests come in increasing order per
worker, so one cached batch and the loader's iterator suffice.

A ``collate_fn`` that pads each batch to its own longest sequence gives batches of different
lengths; the microbatches of one batch are slices of it and share its length (docs/variable-shapes.md
says why), and each transfer carries its own sizes (``comm``).
"""

from __future__ import annotations

import torch

from pipeboard.trainer.task.loading import EpochBatches, for_stage, make_loader, map_tensors, val_loader


MASK_NAME = "attention_mask"  # the input, by the model's forward parameter name, whose nonzeros are the tokens


def token_counter(task, dims: dict[int, int | None]):
    """How to count a batch's tokens (its non-padding positions), or None where the task's inputs
    have no sequence dimension. The sequence dimension is the task's lowest varying dimension
    (``Task.varying_dims``: declared in ``dynamic_dims`` or found). The mask is the input the
    model's forward names ``attention_mask``, when it is (samples, sequence): its nonzeros are the
    tokens; otherwise tokens are the samples times the sequence dimension's size. Call it while
    ``task.model`` is there (the names come from its forward)."""
    if not dims:
        return None
    from pipeboard.trainer.task.task import _input_names

    d = min(dims)
    example = task.example_input(1)
    count = len(example) if isinstance(example, (tuple, list)) else 1
    names = _input_names(task.model, count)
    mask_at = names.index(MASK_NAME) if MASK_NAME in names else None

    def tokens(x) -> int | None:
        inputs = list(x) if isinstance(x, (tuple, list)) else [x]
        if mask_at is not None and mask_at < len(inputs):
            mask = inputs[mask_at]
            if isinstance(mask, torch.Tensor) and mask.dim() == 2 and d == 1:
                return int(mask.count_nonzero())
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.dim() > d:
                return int(t.shape[0]) * int(t.shape[d])
        return None

    return tokens


def _to(value, device: torch.device):
    non_blocking = device.type == "cuda"
    return map_tensors(value, lambda t: t.to(device, non_blocking=non_blocking))


def _part(value, sl: slice):
    return map_tensors(value, lambda t: t[sl])


class TrainStream:
    """``load=False`` (a middle stage): no loader, only the step arithmetic. ``inputs=False`` (a
    last stage that is not also the first): targets only, where the data set can give them alone
    (``target(index)``, see ``pipeboard.trainer.task.loading.TargetsOnly``)."""

    def __init__(self, task, batch_size: int, microbatches: int, device: torch.device, workers: int = 0,
                 load: bool = True, inputs: bool = True, count_tokens=None) -> None:
        self.batch_size = batch_size
        self.microbatches = microbatches
        self.mb_size = batch_size // microbatches
        self.steps_per_epoch = task.batches_per_epoch(batch_size)
        if self.steps_per_epoch < 1:
            raise ValueError(f"batch_size: {batch_size} exceeds the training set ({task.train_size} samples)")
        self.device = device
        self.sampler = EpochBatches(task.train_size, batch_size, task.seed)
        self.loader = make_loader(for_stage(task.train_data, task.collate_fn, inputs), self.sampler, task.collate_fn,
                                  workers,
                                  pin_memory=device.type == "cuda") if load else None
        self._epoch = -1
        self._iter = None
        self._index = -1
        self._batch = None
        self.count_tokens = count_tokens  # token_counter's, where this worker reports the tokens
        self.tokens: dict[int, int] = {}  # step -> its batch's tokens, until take_tokens

    def _batch_of(self, step: int):
        epoch, index = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch or index < self._index:
            # Start the epoch's order at this batch: a resumed run reads nothing it skips.
            self.sampler.set_epoch(epoch, start=index)
            self._epoch, self._iter, self._index = epoch, iter(self.loader), index - 1
        while self._index < index:
            self._batch = next(self._iter)
            self._index += 1
            if self.count_tokens is not None:
                n = self.count_tokens(self._batch[0])
                if n is not None:
                    self.tokens[epoch * self.steps_per_epoch + self._index] = n
        return self._batch

    def take_tokens(self, step: int) -> int | None:
        """The tokens of step ``step``'s batch, once read (None where not counted); forgotten after."""
        return self.tokens.pop(step, None)

    def microbatch(self, g: int):
        """(input, target) of global microbatch ``g`` on the device; input a tensor or a tuple."""
        x, y = self._batch_of(g // self.microbatches)
        part = g % self.microbatches
        sl = slice(part * self.mb_size, (part + 1) * self.mb_size)
        return _to(_part(x, sl), self.device), _to(_part(y, sl), self.device)


class ValStream:
    """The validation split in microbatches of the training microbatch size (the boundary shapes
    are fixed), the last one padded; ``count`` says how many rows are real. Only the stages that
    need data (``load=True``) read it. The split stays in host memory (pinned for a GPU, so each
    copy is asynchronous) and each microbatch goes to the device when it is asked for: a
    validation set the size of the GPU's memory would not fit there whole beside the model."""

    def __init__(self, task, mb_size: int, device: torch.device, load: bool = True, inputs: bool = True) -> None:
        self.parts: list = []
        self.count = task.val_size
        self.length = -(-self.count // mb_size)
        self.device = device
        if not load:
            return
        pin = device.type == "cuda"
        for x, y in val_loader(task, mb_size, inputs=inputs):
            rows = y.shape[0]
            if rows < mb_size:
                pad = mb_size - rows
                x = map_tensors(x, lambda t: torch.cat([t, t[:1].expand(pad, *t.shape[1:])]))
                y = torch.cat([y, y[:1].expand(pad, *y.shape[1:])])
            if pin:
                x, y = map_tensors(x, lambda t: t.pin_memory()), y.pin_memory()
            self.parts.append((x, y))

    def __len__(self) -> int:
        return self.length

    def microbatch(self, j: int):
        if not self.parts:
            return None, None
        x, y = self.parts[j]
        return _to(x, self.device), _to(y, self.device)
