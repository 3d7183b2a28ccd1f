"""Task factories for bench/loading.py: the zoo's image task with real loading, and pre-loaded.

Both build ``resnet18-images`` (``pipeboard.trainer.zoo.hf.resnet18_images``: a transformers ResNet-18 layout
on an imagefolder tree of PNGs, default scikit-learn's digits as 32x32 PNGs) with the same
arguments, so under the same run seed they build the same initial weights:

- ``real``: the task as the zoo makes it; its ``train_data`` is ``pipeboard.trainer.task.datasets.ImageFiles``,
  which opens, decodes, converts, resizes and normalises each PNG on access, in the DataLoader's
  worker processes (``loader_workers``, the task's default unless the run says otherwise);
- ``preloaded``: the same task whose splits were decoded once, when the factory ran, into
  ``TensorDataset``s of the very tensors ``ImageFiles`` returns (``loader_workers=0``: a batch is
  then an index into memory). The model is built before the decode and the decode draws no random
  numbers, so the weights are the real variant's.

Used as ``model="<absolute path>/bench/loading_tasks.py:real"`` (or ``:preloaded``).
"""

from __future__ import annotations

import sys
from pathlib import Path

# pipeboard.trainer.task.factory imports a task file with its folder first on sys.path (so that it can import
# its siblings); this folder, bench/, holds scripts named like stdlib modules (profile.py), which
# would then shadow them: transformers' lazy import of the ResNet classes goes through cProfile,
# which imports `profile`, and fails. Take the folder back off the path before anything imports.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from pipeboard.trainer.task import Task  # noqa: E402
from pipeboard.trainer.zoo.hf import resnet18_images  # noqa: E402


def real(data: str | None = None, width: int = 16, size: int = 32) -> Task:
    """The zoo's ``resnet18-images`` unchanged: PNGs decoded per item in the loader workers."""
    return resnet18_images(data=data, width=width, size=size)


def _decoded(dataset) -> TensorDataset:
    """Every item of an image data set decoded once: ``(float32 [N, C, H, W], int64 [N])``."""
    xs, ys = zip(*(dataset[i] for i in range(len(dataset))))
    return TensorDataset(torch.stack(xs), torch.stack(ys))


def preloaded(data: str | None = None, width: int = 16, size: int = 32) -> Task:
    """The same task on tensors decoded up front: no decoding while training."""
    task = resnet18_images(data=data, width=width, size=size)
    task.train_data = _decoded(task.train_data)
    if task.val_data is not None:
        task.val_data = _decoded(task.val_data)
    task.loader_workers = 0
    task.name = "resnet18-images (pre-loaded tensors)"
    return task
