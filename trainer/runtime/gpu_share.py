"""Several stage processes on one GPU: which GPU each process of a run takes, by memory.

A developer's machine, and the lent test machine, have one GPU; a pipeline of four stages must
still run there. Each stage process needs its predicted peak (trainer/runtime/stage_memory.py,
memory_model's figure) plus what a process costs a GPU before any tensor (its CUDA context and
the caching allocator's slack: ``PROCESS_OVERHEAD_BYTES``). ``pack`` gives each process a GPU:

- the largest need first, each on the GPU with the most room left where it fits (worst fit), so
  with as many GPUs as processes each process has one to itself, and with fewer the memory (and
  so, roughly, the work) spreads evenly;
- where a process fits on no GPU, one line naming it, its need and the most room any GPU has
  left (``ShareError``), before anything starts.

Pure Python on numbers (no torch): the service's placement (app/services/placement.py) packs a
job onto a worker's reported GPUs with it, and tests check it on plain inventories.
"""

from __future__ import annotations

from typing import Sequence

# A CUDA context takes 300-500 MiB of a GPU's memory before the first tensor (driver and kernels
# loaded), and the caching allocator keeps freed blocks: counted once per process sharing a GPU.
PROCESS_OVERHEAD_BYTES = 512 * 2**20


class ShareError(ValueError):
    """No GPU has room for a process: the message is one line."""


def _fmt(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def pack(need: Sequence[int], capacity: Sequence[int], overhead: int = PROCESS_OVERHEAD_BYTES) -> list[int]:
    """Process -> the position in ``capacity`` (each GPU's free bytes) of the GPU it runs on.
    ``need``: each process's predicted peak bytes (``overhead`` is added to each)."""
    if not capacity:
        raise ShareError("no GPU to place the stage processes on")
    if any(n < 0 for n in need) or any(c < 0 for c in capacity):
        raise ShareError("memory figures must be zero or more bytes")
    room = list(capacity)
    out = [-1] * len(need)
    for p in sorted(range(len(need)), key=lambda p: (-need[p], p)):
        want = need[p] + overhead
        best = max(range(len(room)), key=lambda g: (room[g], -g))
        if room[best] < want:
            raise ShareError(f"stage process {p} needs {_fmt(want)} (predicted peak {_fmt(need[p])} and "
                             f"{_fmt(overhead)} for its CUDA context); the most any GPU has left is {_fmt(room[best])}")
        room[best] -= want
        out[p] = best
    return out


def per_process(stage_bytes: dict[int, int], stages_of: Sequence[Sequence[int]]) -> list[int]:
    """Each process's need from the per-stage prediction: a process holding several (virtual)
    stages is one worker, whose figure each of its stages carries (memory_predict); the largest."""
    return [max((stage_bytes.get(s, 0) for s in stages), default=0) for stages in stages_of]
