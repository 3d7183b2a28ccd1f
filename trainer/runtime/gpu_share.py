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


def assign(world: int, count: int, stage_need: Sequence[int] | None = None, free: Sequence[int] | None = None,
           overhead: int = PROCESS_OVERHEAD_BYTES) -> list[int]:
    """Rank -> the visible GPU it runs on, for a run of ``world`` processes on ``count`` GPUs.

    With a GPU per process, rank r takes GPU r (what ``LOCAL_RANK`` gives under torchrun). With
    fewer, the processes share them: packed by ``stage_need`` (each process's predicted peak)
    into ``free`` (each GPU's free bytes), as the service's placement packs them, so a run that
    cannot fit is refused (``ShareError``) before anything starts; where no prediction is known,
    round robin (rank r on GPU r mod count)."""
    if count < 1:
        raise ShareError("no GPU to place the stage processes on")
    if world <= count:
        return list(range(world))
    if stage_need is None or free is None:
        return [r % count for r in range(world)]
    if len(stage_need) != world or len(free) != count:
        raise ShareError(f"memory figures for {len(stage_need)} processes and {len(free)} GPUs; the run has "
                         f"{world} processes on {count} GPUs")
    return pack(list(stage_need), list(free), overhead)


def shares_a_gpu(devices: Sequence[int]) -> bool:
    """Whether two processes of the run are on one GPU."""
    return len(set(devices)) < len(devices)


def pair_transport(devices: Sequence[int], a: int, b: int) -> str:
    """How ranks ``a`` and ``b`` exchange tensors: ``"host"`` on one GPU (NCCL refuses two ranks on
    one device: staged through host memory over the CPU transport, comm.P2P), else ``"nccl"``."""
    return "host" if devices[a] == devices[b] else "nccl"
