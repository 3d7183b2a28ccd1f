"""What a user hands pipeboard to train: a model, its data, its loss, and how to judge it.

A :class:`Task` is plain Python objects; a task *factory* (``package.module:function`` or
``path/to/file.py:function``, see ``pipeboard.trainer.task.factory``) builds one from model arguments and a
data location. The zoo's entries are factories of the same kind, so nothing downstream knows
whether it got a zoo model or a user's.

Data: ``train_data`` (and ``val_data``) are torch ``Dataset``s of ``(input, target)`` items; the
input is a tensor or a tuple of tensors, the target a tensor. They are read through torch's
``DataLoader`` (``pipeboard.trainer.task.loading``) in one order fixed by the run's seed. A data set may
also define ``target(index)``, item ``index``'s target without reading its input: the last stage,
which needs only targets, then never decodes an input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import Dataset

from pipeboard.trainer.task.names import OPTIMIZERS
from pipeboard.trainer.task.metrics import METRICS


PROBE_BATCHES = 4  # batches collated to find the dimensions that vary (Task.varying_dims)


def _input_names(model, count: int) -> list[str]:
    """The model's forward parameter names for its ``count`` inputs (``input i`` where unknown)."""
    import inspect

    try:
        params = [p for p in inspect.signature(model.forward).parameters if p not in ("self",)]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"input {i}" for i in range(count)]


class TaskError(ValueError):
    """A task that cannot be trained as given; the message names the part at fault."""


@dataclass
class Task:
    """A trainable model with its data.

    - ``loss(output, target) -> Tensor``: a scalar, the mean over the microbatch's samples (a
      batch's gradient is the mean of its microbatches'). ``output`` is the model's output (a
      tuple when the model returns several).
    - ``metric``: ``"accuracy"``, ``"perplexity"``, ``"mse"``, ``"loss"`` (the loss on the
      validation split) or a callable ``(outputs, targets) -> float`` over the whole validation
      split; None means ``"loss"`` when there is validation data. ``higher_is_better`` is implied
      by a named metric and must be given with a callable one. ``target``: the value whose
      reaching is time-to-accuracy.
    - ``optimizer``: ``"adam"``, ``"adamw"``, ``"sgd"`` (momentum 0.9), or a callable taking the
      parameters and returning a ``torch.optim.Optimizer``; ``lr`` is the learning rate of a named
      one (a run's ``--lr`` overrides either's).
    - ``collate_fn``: how items become a batch (torch's default collation if None).
    - ``batch_size``: the batch a profile measures when none is asked for.
    - ``loader_workers``: DataLoader worker processes per loading stage (0: load in the training
      process; in-memory data need none).
    - ``dynamic_dims``: input dimensions whose size varies from batch to batch, each with its
      largest size or None (text padded per batch to its own longest sequence: ``{1: 512}``).
      They are captured as dynamic (one capture serves every length) and their sizes travel with
      the tensors between stages. None: found by collating the first few batches (with a
      ``collate_fn`` only; default collation gives one shape), with no known largest size (stage
      transfers then go through the process group, not shared memory, which needs a slot size).
    - ``layers``: the module paths that are the model's layers (what a plan splits between, e.g.
      ``["embed", "blocks.0", "blocks.1", "head"]``); None: the blocks of the model's repeated
      stack and the modules around them (``pipeboard.trainer.profile.granularity``).
    """

    model: nn.Module
    train_data: Dataset
    loss: Callable[..., torch.Tensor]
    val_data: Dataset | None = None
    metric: str | Callable[..., float] | None = None
    higher_is_better: bool | None = None
    target: float | None = None
    optimizer: str | Callable[..., torch.optim.Optimizer] = "adam"
    lr: float = 1e-3
    collate_fn: Callable[[list], Any] | None = None
    batch_size: int = 64
    loader_workers: int = 1
    layers: list[str] | None = None
    dynamic_dims: dict[int, int | None] | None = None
    name: str = ""
    description: str = ""
    model_args: dict[str, Any] = field(default_factory=dict)
    seed: int = 0

    # ---- the metric -----------------------------------------------------------------------------
    @property
    def metric_name(self) -> str | None:
        if self.metric is None:
            return "loss" if self.val_data is not None else None
        if isinstance(self.metric, str):
            return self.metric
        return getattr(self.metric, "__name__", type(self.metric).__name__)

    @property
    def metric_higher_is_better(self) -> bool:
        if self.higher_is_better is not None:
            return self.higher_is_better
        name = self.metric_name
        return METRICS[name][1] if name in METRICS else False  # "loss": lower is better

    def metric_fn(self, outputs, targets) -> float:
        """The metric over the whole validation split: tensors, or lists of per-batch tensors
        (whose lengths may differ: a named metric accumulates them batch by batch, ``Running``)."""
        if callable(self.metric):
            return float(self.metric(outputs, targets))
        running = self.running_metric()
        if isinstance(outputs, (list, tuple)):
            for out, tgt in zip(outputs, targets):
                running.add(out, tgt)
        else:
            running.add(outputs, targets)
        return running.value()

    def running_metric(self):
        """A named metric's batch-by-batch accumulator (``metrics.Running``)."""
        from pipeboard.trainer.task.metrics import Running

        return Running(self.metric_name, self.loss)

    def reached(self, value: float, target: float | None = None) -> bool:
        """Whether a metric value meets ``target`` (default: the task's)."""
        goal = self.target if target is None else target
        if goal is None:
            return False
        return value >= goal if self.metric_higher_is_better else value <= goal

    # ---- the optimizer --------------------------------------------------------------------------
    def make_optimizer(self, params, lr: float | None = None) -> torch.optim.Optimizer:
        params = list(params)
        if not params:  # a pipeline stage of parameterless layers alone (a ReLU): it steps nothing,
            params = [{"params": []}]  # and torch refuses a list without a group, not an empty group
        if callable(self.optimizer):
            opt = self.optimizer(params)
            if not isinstance(opt, torch.optim.Optimizer):
                raise TaskError(f"optimizer: the callable returned {type(opt).__name__}, not a torch.optim.Optimizer")
            if lr is not None:
                for group in opt.param_groups:
                    group["lr"] = lr
            return opt
        lr = self.lr if lr is None else lr
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=lr)
        if self.optimizer == "adamw":
            return torch.optim.AdamW(params, lr=lr)
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=lr, momentum=0.9)
        raise TaskError(f"optimizer: unknown optimizer {self.optimizer!r} (known: {', '.join(OPTIMIZERS)})")

    @property
    def optimizer_name(self) -> str:
        return self.optimizer if isinstance(self.optimizer, str) else "custom"

    # ---- data -----------------------------------------------------------------------------------
    @property
    def train_size(self) -> int:
        return len(self.train_data)

    @property
    def val_size(self) -> int:
        return len(self.val_data) if self.val_data is not None else 0

    def batches_per_epoch(self, batch_size: int) -> int:
        """Full batches per epoch: the last partial batch is dropped, so every microbatch of a
        pipeline has the same shape (the boundaries' buffers are fixed)."""
        return self.train_size // batch_size

    def collate(self, items: list) -> Any:
        from torch.utils.data import default_collate

        return (self.collate_fn or default_collate)(items)

    def example_batch(self, batch_size: int | None = None) -> tuple[Any, Any]:
        """The first ``batch_size`` training items, collated: real data of the right shapes."""
        n = batch_size or self.batch_size
        size = self.train_size
        if size < 1:
            raise TaskError("train_data: the data set is empty")
        return self.collate([self.train_data[i % size] for i in range(n)])

    def varying_dims(self, batch_size: int | None = None) -> dict[int, int | None]:
        """The input dimensions that vary between batches (see ``dynamic_dims``): the declared
        ones, and any in which the first ``PROBE_BATCHES`` batches of ``batch_size`` differ."""
        from pipeboard.trainer.task.loading import map_tensors

        found: dict[int, int | None] = dict(self.dynamic_dims or {})
        if self.collate_fn is None:
            return found
        n, size = batch_size or self.batch_size, self.train_size
        shapes = []
        for b in range(PROBE_BATCHES):
            x, _ = self.collate([self.train_data[(b * n + i) % size] for i in range(n)])
            got: list = []
            map_tensors(x, lambda t: got.append(tuple(t.shape)) or t)
            shapes.append(got)
        for k, first in enumerate(shapes[0]):  # tensor k of each batch against the first batch's
            for d in range(1, len(first)):
                if d not in found and any(len(s) > k and len(s[k]) > d and s[k][d] != first[d] for s in shapes):
                    found[d] = None
        return dict(sorted(found.items()))

    def check_dynamic(self, x, dims: dict[int, int | None]) -> None:
        """TaskError in one line where a batch's input tensors disagree on a dynamic dimension they
        share (token ids and their attention mask of different lengths), or exceed its largest size."""
        tensors = list(x) if isinstance(x, (tuple, list)) else [x]
        names = _input_names(self.model, len(tensors))
        for d, most in dims.items():
            having = [(name, t) for name, t in zip(names, tensors) if isinstance(t, torch.Tensor) and t.dim() > d]
            if len({t.shape[d] for _, t in having}) > 1:
                shown = ", ".join(f"{name} {tuple(t.shape)}" for name, t in having)
                raise TaskError(f"collate_fn: the batch's inputs disagree on dynamic dimension {d}: {shown}")
            if most is not None and having and having[0][1].shape[d] > most:
                raise TaskError(f"collate_fn: {having[0][0]} has {having[0][1].shape[d]} in dynamic dimension {d}, "
                                f"more than its largest size {most} (dynamic_dims)")

    def example_input(self, batch_size: int | None = None):
        """The inputs of :meth:`example_batch`: a tensor, or a tuple of tensors."""
        x, _ = self.example_batch(batch_size)
        return tuple(x) if isinstance(x, list) else x

    def train_batches(self, batch_size: int, epoch: int = 0):
        """One epoch's full batches in the run's seeded order (see ``pipeboard.trainer.task.loading``)."""
        from pipeboard.trainer.task.loading import epoch_loader

        return iter(epoch_loader(self, batch_size, epoch, workers=0))

    def val_batches(self, batch_size: int):
        """The validation split in its fixed order, the last batch possibly short."""
        from pipeboard.trainer.task.loading import val_loader

        if self.val_data is None:
            return iter(())
        return iter(val_loader(self, batch_size, workers=0))

    @torch.no_grad()
    def evaluate(self, model: nn.Module | None = None, batch_size: int = 256) -> float | None:
        """The metric of ``model`` (default: the task's) on the validation split, in one process."""
        if self.val_data is None:
            return None
        model = model or self.model
        was_training = model.training
        model.eval()
        # A named metric sums per batch: batches padded to their own lengths are never concatenated.
        running = None if callable(self.metric) else self.running_metric()
        outs, tgts = [], []
        try:
            for x, y in self.val_batches(batch_size):
                out = model(*x) if isinstance(x, (tuple, list)) else model(x)
                if running is not None:
                    running.add(out, y)
                else:
                    outs.append(out)
                    tgts.append(y)
        finally:
            model.train(was_training)
        return running.value() if running is not None else float(self.metric(outs, tgts))
