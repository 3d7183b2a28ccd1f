"""Batches of a task's data through torch's DataLoader, in one order every worker can reproduce.

Epoch ``e``'s order is a permutation seeded by ``(seed, e)``; batch ``i`` of it is the samples
``order[i * B:(i + 1) * B]``. Every stage that needs data (the first for inputs, the last for
targets) builds the same loader from the same seed, so they agree on which samples make global
microbatch ``g`` without sending anything to each other. Each sample is read once per epoch; the
last partial batch is dropped (a pipeline's boundary buffers have fixed shapes).

Loading overlaps compute: with ``workers > 0`` the DataLoader's worker processes decode the next
batches while the stage computes (``prefetch_factor`` batches each); on CUDA the batches come in
pinned memory, so the copy to the device can be asynchronous.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate

PREFETCH_BATCHES = 2  # per loader worker: enough to hide one slow batch behind the current step


def epoch_order(seed: int, epoch: int, size: int) -> torch.Tensor:
    """The permutation of ``range(size)`` that epoch ``epoch`` of a run seeded ``seed`` reads."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(size, generator=gen)


class EpochBatches(Sampler[list[int]]):
    """Batches of indices of one epoch's seeded order, from batch ``start`` on; ``set_epoch``
    moves it (a DataLoader with persistent workers asks it again at each ``iter``)."""

    def __init__(self, size: int, batch_size: int, seed: int, epoch: int = 0, start: int = 0) -> None:
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.epoch, self.start = epoch, start

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return max(0, self.size // self.batch_size - self.start)

    def __iter__(self):
        order = epoch_order(self.seed, self.epoch, self.size)
        for i in range(self.start, self.size // self.batch_size):
            yield order[i * self.batch_size:(i + 1) * self.batch_size].tolist()


class TargetsOnly(Dataset):
    """A data set's items as ``(empty tensor, target)``, read through its ``target(index)``: what a
    last stage that does not also feed the inputs reads, so that it never decodes an input it
    would throw away (an image's pixels, to get its label)."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return _NO_INPUT, self.dataset.target(index)


_NO_INPUT = torch.empty(0)


def for_stage(dataset, collate_fn, inputs: bool):
    """The data set a stage reads: :class:`TargetsOnly` for one that needs no inputs when the data
    set can give targets alone (and is batched by the default collation, which an empty input
    suits); else the data set itself."""
    if not inputs and collate_fn is None and callable(getattr(dataset, "target", None)):
        return TargetsOnly(dataset)
    return dataset


def make_loader(dataset, batch_sampler, collate_fn, workers: int, pin_memory: bool = False) -> DataLoader:
    return DataLoader(dataset, batch_sampler=batch_sampler, collate_fn=collate_fn or default_collate,
                      num_workers=workers, pin_memory=pin_memory,
                      prefetch_factor=PREFETCH_BATCHES if workers else None, persistent_workers=workers > 0)


def epoch_loader(task, batch_size: int, epoch: int = 0, workers: int = 0) -> DataLoader:
    """One epoch of ``task.train_data`` in full batches of the seeded order."""
    sampler = EpochBatches(task.train_size, batch_size, task.seed, epoch)
    return make_loader(task.train_data, sampler, task.collate_fn, workers)


class _InOrder(Sampler[list[int]]):
    def __init__(self, size: int, batch_size: int) -> None:
        self.size, self.batch_size = size, batch_size

    def __len__(self) -> int:
        return -(-self.size // self.batch_size)

    def __iter__(self):
        for i in range(0, self.size, self.batch_size):
            yield list(range(i, min(self.size, i + self.batch_size)))


def val_loader(task, batch_size: int, workers: int = 0, inputs: bool = True) -> DataLoader:
    """The validation split in its own order, the last batch possibly short."""
    return make_loader(for_stage(task.val_data, task.collate_fn, inputs), _InOrder(task.val_size, batch_size),
                       task.collate_fn, workers)


def map_tensors(value: Any, fn) -> Any:
    """Apply ``fn`` to every tensor of an input (a tensor, or a tuple/list of tensors)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return tuple(map_tensors(v, fn) for v in value)
    return value
