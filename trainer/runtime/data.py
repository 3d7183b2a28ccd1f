"""Microbatches in one global order that every worker can reproduce on its own.

Global microbatch ``g`` is part ``g % M`` of training step ``g // M``; step ``k`` is batch
``k % steps_per_epoch`` of epoch ``k // steps_per_epoch`` in the zoo entry's deterministic order.
The first stage takes the inputs, the last stage the targets; nobody ships data between workers.
Requests come in increasing order per worker, so one cached batch and an iterator suffice.
"""

from __future__ import annotations

import torch


class TrainStream:
    def __init__(self, zoo, batch_size: int, microbatches: int, device: torch.device) -> None:
        self.zoo = zoo
        self.batch_size = batch_size
        self.microbatches = microbatches
        self.mb_size = batch_size // microbatches
        self.steps_per_epoch = zoo.batches_per_epoch(batch_size)
        if self.steps_per_epoch < 1:
            raise ValueError(f"batch_size: {batch_size} exceeds the training set ({zoo.train_size} samples)")
        self.device = device
        self._epoch = -1
        self._iter = None
        self._index = -1
        self._batch: tuple[torch.Tensor, torch.Tensor] | None = None

    def _batch_of(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, index = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch or index < self._index:
            self._epoch, self._iter, self._index = epoch, self.zoo.train_batches(self.batch_size, epoch), -1
        while self._index < index:
            self._batch = next(self._iter)
            self._index += 1
        return self._batch

    def microbatch(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self._batch_of(g // self.microbatches)
        part = g % self.microbatches
        sl = slice(part * self.mb_size, (part + 1) * self.mb_size)
        return x[sl].to(self.device), y[sl].to(self.device)


class ValStream:
    """The validation split in microbatches of the training microbatch size (the boundary shapes
    are fixed), the last one padded; ``count`` says how many rows are real."""

    def __init__(self, zoo, mb_size: int, device: torch.device) -> None:
        self.parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.count = zoo.val_size
        for x, y in zoo.val_batches(mb_size):
            if x.shape[0] < mb_size:
                pad = mb_size - x.shape[0]
                x = torch.cat([x, x[:1].expand(pad, *x.shape[1:])])
                y = torch.cat([y, y[:1].expand(pad, *y.shape[1:])])
            self.parts.append((x.to(device), y.to(device)))

    def __len__(self) -> int:
        return len(self.parts)

    def microbatch(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.parts[j]
