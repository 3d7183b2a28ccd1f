"""Check a task before any worker starts: every mistake a one-line :class:`TaskError`.

What is checked: the data sets hold ``(input, target)`` items whose shapes agree, a batch goes
through the model, and the loss of it is a scalar. A worker would otherwise fail minutes later,
mid-pipeline, with a message about tensor shapes at a stage boundary.
"""

from __future__ import annotations

from typing import Any

import torch

from pipeboard.trainer.task.metrics import METRICS
from pipeboard.trainer.task.task import Task, TaskError

SHAPE_CHECK_ITEMS = 64  # items whose shapes are compared (more costs decode time, rarely finds more)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _shapes(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, (tuple, list)):
        return tuple(_shapes(v) for v in value)
    return type(value).__name__


def _is_input(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and len(value) > 0 and all(isinstance(v, torch.Tensor) for v in value)


def _item(data, split: str, i: int):
    try:
        item = data[i]
    except Exception as exc:
        raise TaskError(f"{split}: reading item {i} raised {type(exc).__name__}: {exc}") from None
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        what = f"a {len(item)}-tuple" if isinstance(item, (tuple, list)) else _describe(item)
        raise TaskError(f"{split}: items must be (input, target) pairs; item {i} is {what}")
    x, y = item
    if not _is_input(x):
        raise TaskError(f"{split}: an item's input must be a tensor or a tuple of tensors; item {i}'s is {_describe(x)}")
    if not isinstance(y, (torch.Tensor, int, float)):
        raise TaskError(f"{split}: an item's target must be a tensor or a number; item {i}'s is {_describe(y)}")
    return x, y


def check_data(data, split: str, batch_size: int, own_collate: bool) -> None:
    if data is None:
        return
    if not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
        raise TaskError(f"{split}: must be a map-style torch Dataset (with __len__ and __getitem__), "
                        f"got {type(data).__name__}")
    n = len(data)
    if n < 1:
        raise TaskError(f"{split}: the data set is empty")
    x0, y0 = _item(data, split, 0)
    if own_collate:
        return  # the task's collate_fn may pad items of different shapes
    want = (_shapes(x0), _shapes(y0))
    for i in range(1, min(n, max(batch_size, SHAPE_CHECK_ITEMS))):
        x, y = _item(data, split, i)
        got = (_shapes(x), _shapes(y))
        if got != want:
            part, a, b = ("input", want[0], got[0]) if got[0] != want[0] else ("target", want[1], got[1])
            raise TaskError(f"{split}: samples' shapes disagree: item 0's {part} is {a}, item {i}'s is {b} "
                            "(give the task a collate_fn that pads them, or make them equal)")


def check_task(task: Task, batch_size: int | None = None) -> None:
    """Raise a TaskError naming the first thing about ``task`` that cannot train."""
    if not isinstance(task.model, torch.nn.Module):
        raise TaskError(f"model: must be a torch.nn.Module, got {type(task.model).__name__}")
    if not callable(task.loss):
        raise TaskError(f"loss: must be a callable loss(output, target), got {type(task.loss).__name__}")
    bs = batch_size or task.batch_size
    check_data(task.train_data, "train_data", bs, task.collate_fn is not None)
    check_data(task.val_data, "val_data", bs, task.collate_fn is not None)
    if bs > len(task.train_data):
        raise TaskError(f"batch_size: {bs} exceeds the training set ({len(task.train_data)} samples)")
    if isinstance(task.metric, str) and task.metric not in (*METRICS, "loss"):
        raise TaskError(f"metric: unknown metric {task.metric!r} (known: {', '.join((*METRICS, 'loss'))}, or a callable)")
    if task.metric is not None and not isinstance(task.metric, str) and not callable(task.metric):
        raise TaskError(f"metric: must be a name or a callable, got {type(task.metric).__name__}")
    if callable(task.metric) and task.higher_is_better is None:
        raise TaskError("higher_is_better: must be given with a callable metric")
    if task.metric is not None and task.val_data is None:
        raise TaskError("metric: needs val_data to be measured on")
    try:
        x, y = task.example_batch(min(bs, 2))
    except Exception as exc:
        raise TaskError(f"collate_fn: batching train_data raised {type(exc).__name__}: {exc}") from None
    if not _is_input(x) or not isinstance(y, torch.Tensor):
        raise TaskError(f"collate_fn: a batch must be (input tensor or tuple of tensors, target tensor); "
                        f"got ({_describe(x)}, {_describe(y)})")
    try:
        dims = task.varying_dims(min(bs, 2))
    except Exception as exc:
        raise TaskError(f"collate_fn: batching train_data raised {type(exc).__name__}: {exc}") from None
    task.check_dynamic(x, dims)  # at the first batch, before any worker starts
    model = task.model
    was_training = model.training
    model.eval()  # no BatchNorm statistics updated, no dropout drawn: the check leaves no trace
    try:
        with torch.no_grad():
            out = model(*x) if isinstance(x, (tuple, list)) else model(x)
    except Exception as exc:
        raise TaskError(f"model: its forward on a batch of train_data raised {type(exc).__name__}: {exc}") from None
    finally:
        model.train(was_training)
    try:
        loss = task.loss(out, y)
    except Exception as exc:
        raise TaskError(f"loss: raised {type(exc).__name__}: {exc} (on the model's output, "
                        f"{_describe(out)}, and the target, {_describe(y)})") from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TaskError(f"loss: must return a scalar tensor (the batch's mean loss); it returned {_describe(loss)}")
