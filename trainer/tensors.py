"""The tensors inside a value as models pass them: a tensor, or tuples, lists and dicts of them."""

from __future__ import annotations

from typing import Any

import torch


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor in ``value``, depth first, in order (other leaves left out)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in tensors_in(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors_in(item)]
    return []
