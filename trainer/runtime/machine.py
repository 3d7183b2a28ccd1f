"""The machine's half of a profile's calibration, measured once and kept for a while.

A calibrated profile holds two kinds of figures: the model's (its layers, their weight gradients
at the run's batch, loading its data) and the machine's: the link between two worker processes
(links.py) and the runtime's per-action overhead (overhead.py). The machine's do not depend on
the model, yet took most of a small model's profiling (docs/runtime.md, "Predicting a run's time
per step"). So they are kept in one JSON file per machine, under ``cache_dir``, and measured
again when older than ``max_age_s``.

"The machine" is everything the figures depend on: the processor, the cores this process may
use, the transport local runs use, torch's version, the matrix-product kernels and the source of
the two measuring modules (a change to how they measure is a new machine).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from pipeboard.trainer.profile.schema import Link, Overhead


def machine_key() -> dict[str, Any]:
    """What the machine figures depend on (see the module docstring)."""
    import torch

    from pipeboard.trainer import cpu_matmul, hostinfo
    from pipeboard.trainer.runtime import links, overhead
    from pipeboard.trainer.runtime.links import runtime_transport

    code = hashlib.sha256()
    for module in (links, overhead):
        code.update(Path(module.__file__).read_bytes())
    return {"processor": hostinfo.cpu_name(), "cores": hostinfo.usable_cores(), "transport": runtime_transport(),
            "torch": torch.__version__, "matmul": cpu_matmul.active(), "code": code.hexdigest()[:16]}


def _path(cache_dir: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return Path(cache_dir) / f"machine-{digest}.json"


def measure() -> tuple[Link, Overhead]:
    from pipeboard.trainer.runtime.links import measure_link
    from pipeboard.trainer.runtime.overhead import calibrate

    return measure_link(), calibrate()


def calibration(cache_dir: str | Path | None, max_age_s: float) -> tuple[Link, Overhead, dict[str, Any]]:
    """The machine's link and overhead: the kept ones when ``cache_dir`` holds them for this
    machine and they are at most ``max_age_s`` old, else measured now (and kept there). The dict
    says which: {"measured_at": epoch seconds, "reused": bool}."""
    key = machine_key()
    path = _path(Path(cache_dir), key) if cache_dir else None
    if path is not None and max_age_s > 0:
        try:
            kept = json.loads(path.read_text())
            age = time.time() - float(kept["measured_at"])
            if kept.get("key") == key and 0 <= age <= max_age_s:
                return (Link.from_dict(kept["link"]), Overhead.from_dict(kept["overhead"]),
                        {"measured_at": kept["measured_at"], "reused": True})
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none kept, or unreadable: measure
    link, over = measure()
    measured_at = time.time()
    if path is not None:
        from dataclasses import asdict

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "measured_at": measured_at, "link": asdict(link),
                                   "overhead": asdict(over)}))
        os.replace(tmp, path)  # atomic: profiles measuring at once each leave a whole file
    return link, over, {"measured_at": measured_at, "reused": False}
