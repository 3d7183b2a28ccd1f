"""The arithmetic a run trains in: ``fp32``, or ``bf16`` mixed precision.

bf16 runs the forward (and the loss) under ``torch.autocast``: matrix products and convolutions
in bfloat16, reductions and norms in float32 as autocast decides, while the parameters, their
gradients and the optimizer state stay float32 (the master weights). The backward runs outside
autocast, as PyTorch prescribes: autograd replays each op in the dtype its forward used. bfloat16
keeps float32's exponent range, so no loss scaling is needed. Profiles measure under the same
context, so a bf16 plan is made from bf16 times.
"""

from __future__ import annotations

from contextlib import nullcontext

PRECISIONS = ("fp32", "bf16")


def check(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision: must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def autocast(device_type: str, precision: str):
    """The context a forward of a run in ``precision`` on ``device_type`` runs in."""
    if check(precision) == "fp32":
        return nullcontext()
    import torch

    return torch.autocast(device_type, dtype=torch.bfloat16)
