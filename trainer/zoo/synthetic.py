"""`mlp`: a plain regression MLP on synthetic data, the runtime's benchmark model.

Every hidden layer is ``Linear(width, width) + ReLU``, so stages of equal layer count cost the
same. The data come from a fixed random "teacher" network (seeded independently of the model),
so they are generated in milliseconds, need no files, and are learnable.
"""

from __future__ import annotations

import torch
from torch import nn

from torch.utils.data import TensorDataset

from pipeboard.trainer.task import Task

DATA_SEED = 1234
VAL_SHARE = 0.2


class RegressionMLP(nn.Module):
    def __init__(self, depth: int, width: int, out: int):
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        layers.append(nn.Linear(width, out))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def _teacher_data(samples: int, width: int, out: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(DATA_SEED)
    x = torch.randn(samples, width, generator=gen)
    hidden = 64
    w1 = torch.randn(width, hidden, generator=gen) / width**0.5
    w2 = torch.randn(hidden, out, generator=gen) / hidden**0.5
    y = torch.tanh(x @ w1) @ w2
    y = (y - y.mean(0)) / y.std(0)  # unit variance per output: predicting zeros scores mse 1.0
    return x, y


def mlp(depth: int = 8, width: int = 1024, out: int = 16, samples: int = 4096) -> Task:
    for name, value in (("depth", depth), ("width", width), ("out", out), ("samples", samples)):
        if value < 1:
            raise ValueError(f"model arg {name!r} must be >= 1, got {value}")
    x, y = _teacher_data(samples, width, out)
    n_val = max(1, int(samples * VAL_SHARE))
    return Task(
        model=RegressionMLP(depth, width, out),
        train_data=TensorDataset(x[n_val:], y[n_val:]), val_data=TensorDataset(x[:n_val], y[:n_val]),
        loss=nn.functional.mse_loss, metric="mse", target=0.7, optimizer="adam", lr=1e-4,
        batch_size=64, loader_workers=0, name="mlp",
        description="synthetic regression MLP (depth x Linear(width, width)+ReLU); the runtime benchmark",
    )
