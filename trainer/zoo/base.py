"""What a zoo entry is: a model plus its data, loss, metric and time-to-accuracy target.

Data live in memory as two tensors per split (inputs, targets); batches are slices of them.
The train order is a permutation seeded by ``(seed, epoch)``, so every worker of a pipeline and
every rerun sees the same batches; the validation split is fixed when the entry is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]


def _cat(parts: torch.Tensor | list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
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
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


METRICS: dict[str, tuple[Callable[..., float], bool]] = {
    # name -> (function, higher_is_better)
    "accuracy": (accuracy, True),
    "perplexity": (perplexity, False),
    "mse": (mean_squared_error, False),
}


@dataclass
class ZooModel:
    """A trainable model with its shipped data set.

    ``model`` is built deterministically from ``seed``. ``train_x``/``train_y`` and
    ``val_x``/``val_y`` hold the fixed split. ``optimizer`` and ``lr`` say how the entry is meant
    to be trained (the runtime and the profiler's optimizer-state bytes both use them).
    """

    name: str
    model: nn.Module
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    metric_name: str
    target: float
    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    description: str = ""
    optimizer: str = "adam"
    lr: float = 1e-3
    default_batch_size: int = 64
    seed: int = 0
    model_args: dict[str, Any] = field(default_factory=dict)

    @property
    def metric_fn(self) -> Callable[..., float]:
        return METRICS[self.metric_name][0]

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.metric_name][1]

    @property
    def train_size(self) -> int:
        return int(self.train_x.shape[0])

    @property
    def val_size(self) -> int:
        return int(self.val_x.shape[0])

    def reached(self, value: float) -> bool:
        """Whether a metric value meets the time-to-accuracy target."""
        return value >= self.target if self.higher_is_better else value <= self.target

    def example_input(self, batch_size: int | None = None) -> torch.Tensor:
        """The first ``batch_size`` training inputs: real data with the right shape and dtype."""
        n = batch_size or self.default_batch_size
        reps = -(-n // self.train_size)
        x = self.train_x if reps == 1 else self.train_x.repeat(reps, *[1] * (self.train_x.dim() - 1))
        return x[:n].clone()

    def batches_per_epoch(self, batch_size: int) -> int:
        return self.train_size // batch_size

    def train_batches(self, batch_size: int, epoch: int = 0) -> Iterator[Batch]:
        """Full batches of one epoch in an order fixed by (seed, epoch); the remainder is dropped
        so every microbatch of a pipeline has the same shape."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(self.train_size, generator=gen)
        for i in range(self.batches_per_epoch(batch_size)):
            idx = order[i * batch_size : (i + 1) * batch_size]
            yield self.train_x[idx], self.train_y[idx]

    def val_batches(self, batch_size: int) -> Iterator[Batch]:
        """The validation split in its fixed order, the last batch possibly short."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        for i in range(0, self.val_size, batch_size):
            yield self.val_x[i : i + batch_size], self.val_y[i : i + batch_size]

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr)
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=0.9)
        raise ValueError(f"unknown optimizer {self.optimizer!r}")

    @torch.no_grad()
    def evaluate(self, model: nn.Module | None = None, batch_size: int = 256) -> float:
        """The declared metric of ``model`` (default: this entry's) on the validation split."""
        model = model or self.model
        was_training = model.training
        model.eval()
        outs, tgts = [], []
        for x, y in self.val_batches(batch_size):
            outs.append(model(x))
            tgts.append(y)
        model.train(was_training)
        return self.metric_fn(outs, tgts)


def build_seeded(seed: int, ctor: Callable[[], nn.Module]) -> nn.Module:
    """Build a module with its initial weights fixed by ``seed``, leaving the caller's global RNG
    state untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ctor()
