"""Validation metrics by name: each takes the outputs and targets of the whole validation split
(tensors, or lists of per-microbatch tensors, which ``join`` pads to one where lengths differ)
and returns a float."""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn


# Target positions no metric counts: what a batch padded to its own longest sequence puts beyond
# each sequence's end when concatenated with longer ones (torch's cross_entropy ignores it too).
IGNORE_INDEX = -100


def join(parts, fill: float | int = 0, name: str = "outputs") -> torch.Tensor:
    """Per-microbatch tensors as one, each padded with ``fill`` to the longest in every
    dimension after the first: validation microbatches of text padded per batch differ in
    length. Padding targets with IGNORE_INDEX keeps a per-token mean over the whole split (not a
    mean of the batches' means); float targets cannot be padded so, and differing is an error."""
    if isinstance(parts, torch.Tensor):
        return parts
    parts = [p.detach() for p in parts]
    shapes = {tuple(p.shape[1:]) for p in parts}
    if len(shapes) <= 1:
        return torch.cat(parts)
    if fill == IGNORE_INDEX and any(p.is_floating_point() for p in parts):
        raise ValueError(f"{name}: float targets of different shapes {sorted(shapes)} cannot be padded to be "
                         f"ignored; give the task a callable metric")
    longest = [max(sizes) for sizes in zip(*shapes)]
    out = parts[0].new_full((sum(p.shape[0] for p in parts), *longest), fill)
    row = 0
    for p in parts:
        out[(slice(row, row + p.shape[0]), *(slice(0, n) for n in p.shape[1:]))] = p
        row += p.shape[0]
    return out


def join_targets(parts) -> torch.Tensor:
    return join(parts, IGNORE_INDEX, "targets")


def _cat(parts) -> torch.Tensor:
    return join(parts)


def accuracy(outputs, targets) -> float:
    """Share of rows (token targets: of positions, IGNORE_INDEX left out) whose arg-max class
    equals the target class."""
    out, tgt = _cat(outputs), join_targets(targets)
    counted = tgt != IGNORE_INDEX
    return float(((out.argmax(dim=-1) == tgt) & counted).sum() / counted.sum().clamp(min=1))


def perplexity(outputs, targets) -> float:
    """exp of the mean per-token cross-entropy over the split; outputs are logits [..., vocab],
    positions whose target is IGNORE_INDEX (padding) left out."""
    out, tgt = _cat(outputs), join_targets(targets)
    ce = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(), tgt.reshape(-1))
    return float(math.exp(float(ce)))


def mean_squared_error(outputs, targets) -> float:
    out, tgt = _cat(outputs), join_targets(targets)
    return float(nn.functional.mse_loss(out.float(), tgt.float()))


def token_cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A language model's loss: cross-entropy over every position of logits [..., vocab]."""
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))


METRICS: dict[str, tuple[Callable[..., float], bool]] = {
    # name -> (function, higher_is_better); "loss" (the task's own loss on the validation split)
    # is resolved by the task, which owns the loss.
    "accuracy": (accuracy, True),
    "perplexity": (perplexity, False),
    "mse": (mean_squared_error, False),
}


def counted(target: torch.Tensor) -> int:
    """How many target elements a mean-reduced loss averages over: integer targets leave out
    IGNORE_INDEX (padding), float targets count every element."""
    if target.is_floating_point():
        return target.numel()
    return int((target != IGNORE_INDEX).sum())


class Running:
    """A metric accumulated batch by batch: per-batch sums and counts, never one tensor of the
    whole split, so batches padded to their own lengths need no common shape. ``value`` equals
    the metric over the concatenated split (a per-token mean, not a mean of the batches' means).
    ``loss``: the task's loss, for the metric "loss" (averaged over ``counted`` targets, as
    torch's mean reduction does)."""

    def __init__(self, name: str, loss: Callable[..., torch.Tensor] | None = None):
        if name != "loss" and name not in METRICS:
            raise ValueError(f"metric: unknown name {name!r}")
        self.name, self.loss = name, loss
        self.total, self.count = 0.0, 0

    def add(self, output: torch.Tensor, target: torch.Tensor) -> None:
        output, target = output.detach(), target.detach()
        if self.name == "loss":
            n = counted(target)
            self.total += float(self.loss(output, target)) * n
        elif self.name == "accuracy":
            keep = target != IGNORE_INDEX
            n = int(keep.sum())
            self.total += float(((output.argmax(dim=-1) == target) & keep).sum())
        elif self.name == "perplexity":
            n = counted(target)
            self.total += float(nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]).float(),
                                                            target.reshape(-1), reduction="sum"))
        else:  # mse
            n = target.numel()
            self.total += float(nn.functional.mse_loss(output.float(), target.float(), reduction="sum"))
        self.count += n

    def value(self) -> float:
        if self.name == "accuracy":
            return self.total / max(self.count, 1)
        mean = self.total / self.count if self.count else float("nan")
        return math.exp(mean) if self.name == "perplexity" else mean
