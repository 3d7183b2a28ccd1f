"""Validation metrics by name: each takes the outputs and targets of the whole validation split
(tensors, or lists of per-microbatch tensors) and returns a float."""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn


def _cat(parts) -> torch.Tensor:
    if isinstance(parts, torch.Tensor):
        return parts
    return torch.cat([p.detach() for p in parts])


def accuracy(outputs, targets) -> float:
    """Share of rows whose arg-max class equals the target class."""
    out, tgt = _cat(outputs), _cat(targets)
    return float((out.argmax(dim=-1) == tgt).float().mean())


def perplexity(outputs, targets) -> float:
    """exp of the mean per-token cross-entropy; outputs are logits [..., vocab]."""
    out, tgt = _cat(outputs), _cat(targets)
    ce = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(), tgt.reshape(-1))
    return float(math.exp(float(ce)))


def mean_squared_error(outputs, targets) -> float:
    out, tgt = _cat(outputs), _cat(targets)
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
