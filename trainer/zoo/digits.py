"""Three classifiers on scikit-learn's bundled digits (1,797 8x8 images, 10 classes).

No BatchNorm or Dropout: a pipeline runs the model per microbatch, and those layers would make
the pipelined result differ from the single-process one.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from torch.utils.data import TensorDataset

from pipeboard.trainer.task import Task

VAL_SHARE = 0.2


@lru_cache(maxsize=1)
def digits_images() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 images and labels. Read straight from the CSV that scikit-learn ships: importing
    ``sklearn.datasets`` costs seconds, reading the file a fraction of one."""
    import importlib.util

    import numpy as np

    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    csv = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz" if spec else None
    if csv is not None and csv.is_file():
        table = np.loadtxt(csv, delimiter=",")
        images, labels = table[:, :-1].reshape(-1, 8, 8), table[:, -1]
    else:  # a layout change in scikit-learn: take the public (slower) way
        from sklearn.datasets import load_digits

        data = load_digits()
        images, labels = data.images, data.target
    x = torch.tensor(images, dtype=torch.float32) / 16.0  # pixel values are 0..16
    y = torch.tensor(labels, dtype=torch.long)
    return x, y


def _split(flat: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fixed split: the permutation depends on nothing but its own seed (0), so the validation
    images never change with the run's seed."""
    x, y = digits_images()
    x = x.reshape(len(x), 64) if flat else x.unsqueeze(1)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    n_val = int(len(x) * VAL_SHARE)
    val, train = order[:n_val], order[n_val:]
    return x[train], y[train], x[val], y[val]


class DigitsMLP(nn.Module):
    def __init__(self, hidden: int = 128, depth: int = 2):
        super().__init__()
        layers: list[nn.Module] = []
        width = 64
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, 10))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class DigitsCNN(nn.Module):
    def __init__(self, channels: int = 32):
        super().__init__()
        c = channels
        self.conv1 = nn.Conv2d(1, c, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c, 2 * c, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)  # 8x8 -> 4x4
        self.conv3 = nn.Conv2d(2 * c, 2 * c, 3, padding=1)
        self.relu3 = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(2 * c * 16, 128)
        self.relu4 = nn.ReLU()
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.pool(self.relu2(self.conv2(self.relu1(self.conv1(x)))))
        x = self.flatten(self.relu3(self.conv3(x)))
        return self.fc2(self.relu4(self.fc1(x)))


class ResidualBlock(nn.Module):
    """conv-relu-conv plus the identity (or a 1x1 projection when the shape changes)."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.shortcut = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()
        self.relu2 = nn.ReLU()

    def forward(self, x):
        return self.relu2(self.conv2(self.relu1(self.conv1(x))) + self.shortcut(x))


class DigitsResNet(nn.Module):
    """A small residual net: its layer graph is a DAG (each block's add joins two paths).

    Spatial layout matters for digits, so the head sees a 4x4 map rather than a global average.
    """

    def __init__(self, channels: int = 16, blocks: int = 3):
        super().__init__()
        if blocks < 1:
            raise ValueError(f"model arg 'blocks' must be >= 1, got {blocks}")
        c = channels
        self.stem = nn.Conv2d(1, c, 3, padding=1)
        self.stem_relu = nn.ReLU()
        self.block1 = ResidualBlock(c, c)
        self.pool = nn.MaxPool2d(2)  # 8x8 -> 4x4
        self.blocks = nn.Sequential(*[ResidualBlock(c if i == 0 else 2 * c, 2 * c) for i in range(blocks - 1)])
        self.flatten = nn.Flatten()
        self.head = nn.Linear((2 * c if blocks > 1 else c) * 16, 10)

    def forward(self, x):
        x = self.pool(self.block1(self.stem_relu(self.stem(x))))
        return self.head(self.flatten(self.blocks(x)))


def _task(name: str, model: nn.Module, flat: bool, description: str, target: float) -> Task:
    train_x, train_y, val_x, val_y = _split(flat)
    return Task(
        model=model, train_data=TensorDataset(train_x, train_y), val_data=TensorDataset(val_x, val_y),
        loss=nn.functional.cross_entropy, metric="accuracy", target=target, optimizer="adam", lr=1e-3,
        batch_size=64, loader_workers=0, name=name, description=description,
    )


def mlp_digits(hidden: int = 128, depth: int = 2) -> Task:
    return _task("mlp-digits", DigitsMLP(hidden, depth), True,
                 "MLP on scikit-learn digits (8x8 images, 10 classes)", 0.95)


def cnn_digits(channels: int = 32) -> Task:
    return _task("cnn-digits", DigitsCNN(channels), False, "3-layer CNN on scikit-learn digits", 0.96)


def resnet_digits(channels: int = 16, blocks: int = 3) -> Task:
    return _task("resnet-digits", DigitsResNet(channels, blocks), False,
                 "residual CNN (a DAG of skip connections) on scikit-learn digits", 0.96)
