"""This host's accelerators, as torch reports them: what a worker says at start and with each
heartbeat (``worker_heartbeats.devices``), what ``/health`` and ``GET /api/v1/workers`` list and
what placement (app/services/placement.py) hands out.

In app/core, not in a service: the Celery worker imports it, and a service that imported the
worker back would be an import cycle (tests/test_import_contracts.py).

Each device is ``{"index", "name", "memory_bytes", "capability", "cuda", "driver"}``: the index
torch numbers it by in this process (under ``CUDA_VISIBLE_DEVICES``, the visible ones from 0), its
name and total memory, its compute capability ("9.0"), the CUDA version torch was built with and
the driver's CUDA version (torch's ``cudaDriverGetVersion``, e.g. "12.4"). A host where torch sees
no GPU (or a CPU-only torch) reports ``[]``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

PROBE_TIMEOUT_S = 60.0  # a first CUDA initialisation can take tens of seconds on a big machine


def _driver_version(torch) -> str | None:
    """The driver's CUDA version as "major.minor", or None where torch does not say."""
    get = getattr(torch._C, "_cuda_getDriverVersion", None)
    if get is None:
        return None
    try:
        v = int(get())
    except (RuntimeError, ValueError):
        return None
    return f"{v // 1000}.{(v % 1000) // 10}" if v > 0 else None


def probe_devices() -> list[dict[str, Any]]:
    """This process's GPUs, index order; ``[]`` where there are none."""
    import torch

    if not torch.cuda.is_available():
        return []
    driver = _driver_version(torch)
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": props.name, "memory_bytes": int(props.total_memory),
                    "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda, "driver": driver})
    return out


def gpu_count(devices: list[dict[str, Any]] | None) -> int:
    """How many GPUs a reported inventory lists (None: a worker that never reported, 0)."""
    return len(devices or [])


def probe_devices_apart(timeout_s: float = PROBE_TIMEOUT_S) -> list[dict[str, Any]]:
    """``probe_devices`` in a child process. The Celery worker forks its training processes, and
    CUDA initialised in a parent does not work in a forked child ("Cannot re-initialize CUDA in
    forked subprocess"): asking for the devices' properties initialises it, so the worker asks a
    child of its own instead. RuntimeError in one line when the child fails."""
    code = "import json; from pipeboard.app.core.devices import probe_devices; print(json.dumps(probe_devices()))"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"GPU probe: no answer from torch within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"GPU probe: exit {done.returncode}: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])
