"""Comparing trained models in tests."""

from __future__ import annotations

import torch


def max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """The largest absolute difference between same-named parameters of two models."""
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    return max(float((pa[k] - pb[k]).detach().abs().max()) for k in pa)
