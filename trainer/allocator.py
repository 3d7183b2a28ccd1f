"""The CPU allocator settings the runtime trains with, and that profiles are measured under.

A profile predicts what a run costs, so both run with the same two settings; without them a
profiled backward pays page faults that a worker's does not, and the profile overstates what the
run's backward costs (docs/runtime.md, "Memory", has the measurement).

``keep_freed_memory``: glibc by default mmaps large blocks and unmaps them on free, so every
step's fresh weight gradients (and pipedream's per-minibatch ones) cost page faults and kernel
zeroing, a large share of a pipedream stage's CPU time on the benchmark MLP. Serving blocks up to
32 MiB from the heap, and trimming the heap only when more than 1 GiB lies free at its top, ends
those faults: freed gradient memory is reused as it is (docs/runtime.md, "Memory", for the fault
counts).

``prefer_huge_pages``: a stage streams its weights through the cache on every forward and
input-gradient backward of a small microbatch (16 MiB per 4-layer stage of the benchmark's
1024-wide mlp, twice that with a stashed version), which costs a TLB miss per 4 KiB page. With
``THP_MEM_ALLOC_ENABLE=1``, PyTorch's CPU allocator marks every allocation of 2 MiB or more
``MADV_HUGEPAGE``, so the kernel backs its 2 MiB-aligned part with huge pages where transparent
huge pages are in ``madvise`` mode (the common default; with ``never`` nothing changes). It is
worth a few percent of throughput on the benchmark's pipedream configuration (docs/runtime.md,
"Memory", for the measurement). PyTorch reads the variable once, at the process's first CPU
allocation: it must be in the environment before torch allocates anything. Forked workers
inherit the launcher's setting, spawned ones read the environment. An explicit
``THP_MEM_ALLOC_ENABLE=0`` is left alone.
"""

from __future__ import annotations

import os

VARIABLE = "THP_MEM_ALLOC_ENABLE"

_kept = False  # whether keep_freed_memory has run in this process (fork copies it, as it does malloc's state)


def prefer_huge_pages() -> None:
    """Ask for huge pages for large tensors of this process and the processes it starts, unless
    the environment already says otherwise. Call it before importing torch."""
    os.environ.setdefault(VARIABLE, "1")


def keep_freed_memory() -> None:
    """glibc: serve blocks up to 32 MiB from the heap and hand freed memory back to the system
    only when more than 1 GiB lies free at the heap's top (the process keeps its peak heap, short
    of that). Any time; it applies to later allocations."""
    global _kept
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (fixed: glibc stops adjusting it)
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
        _kept = True
    except (OSError, AttributeError):  # not glibc: nothing to set
        pass


def settings() -> dict[str, bool]:
    """What this process runs with, for a profile's metadata."""
    return {"huge_pages": os.environ.get(VARIABLE) == "1", "keep_freed_memory": _kept}
