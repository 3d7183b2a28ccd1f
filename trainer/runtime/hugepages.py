"""Transparent huge pages for the runtime's large CPU tensors.

A stage streams its weights through the cache on every forward and input-gradient backward of a
small microbatch (16 MB per 4-layer stage of the benchmark's 1024-wide mlp, twice that with a
stashed version), which costs a TLB miss per 4 KiB page. With ``THP_MEM_ALLOC_ENABLE=1``,
PyTorch's CPU allocator marks every allocation of 2 MiB or more ``MADV_HUGEPAGE``, so the kernel
backs its 2 MiB-aligned part with huge pages where transparent huge pages are in ``madvise``
mode (the common default, and this machine's; with ``never`` nothing changes). Measured on
bench/runtime.py's configuration (b), pipedream, alternating runs without and with it: 3,393 /
3,521 and 3,435 / 3,501 samples/s (+2-4%); the no-communication ceiling moved alike.

PyTorch reads the variable once, at the process's first CPU allocation: it must be in the
environment before torch allocates anything. Forked workers inherit the launcher's setting,
spawned ones read the environment. An explicit ``THP_MEM_ALLOC_ENABLE=0`` is left alone.
"""

from __future__ import annotations

import os

VARIABLE = "THP_MEM_ALLOC_ENABLE"


def prefer_huge_pages() -> None:
    """Ask for huge pages for large tensors of this process and the processes it starts, unless
    the environment already says otherwise. Call it before importing torch."""
    os.environ.setdefault(VARIABLE, "1")
