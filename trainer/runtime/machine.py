"""The machine's half of a profile's calibration, measured once and kept for a while.

A calibrated profile holds two kinds of figures: the model's (its layers, their weight gradients
at the run's batch, loading its data) and the machine's: the link between two worker processes
(links.py) and the runtime's per-action overhead (overhead.py). The machine's do not depend on
the model, yet took most of a small model's profiling (docs/runtime.md, "Predicting a run's time
per step"). So they are kept in one JSON file per machine, under ``cache_dir``, and measured
again when older than ``max_age_s``.

"The machine" is everything the figures depend on: the processor, the cores this process may
use, the transport local runs use, torch's version, the matrix-product kernels, the source of
the two measuring modules (a change to how they measure is a new machine), and the device the
profile is for (``device_label``: ``cpu``, or ``cuda`` with the GPU's name and capability), so
a GPU profile never reuses a CPU profile's kept figures. Both measurements run between CPU
processes today; for a cuda profile the calibration says so (``measured_on`` and ``note`` in
``meta.machine_calibration``), and ``device_note`` says it wherever a profile predicts a run on
another device than it was measured on (the job's ``fidelity.device_note``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from pipeboard.trainer.profile.calibration_records import Link, Overhead


MEASURED_ON = "cpu"  # links.measure_link and overhead.calibrate time CPU processes and CPU tensors


def device_label(device: str = "cpu") -> str:
    """``cpu``, or ``cuda: <GPU name> (<capability>)`` of the first GPU this process sees."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        return "cuda: no GPU visible"
    major, minor = torch.cuda.get_device_capability(0)
    return f"cuda: {torch.cuda.get_device_name(0)} ({major}.{minor})"


def machine_key(device: str = "cpu") -> dict[str, Any]:
    """What the machine figures depend on (see the module docstring)."""
    import torch

    from pipeboard.trainer import cpu_matmul, hostinfo
    from pipeboard.trainer.runtime import links, overhead
    from pipeboard.trainer.runtime.links import runtime_transport

    code = hashlib.sha256()
    for module in (links, overhead):
        code.update(Path(module.__file__).read_bytes())
    return {"processor": hostinfo.cpu_name(), "cores": hostinfo.usable_cores(), "transport": runtime_transport(),
            "torch": torch.__version__, "matmul": cpu_matmul.active(), "code": code.hexdigest()[:16],
            "device": device_label(device)}


def _path(cache_dir: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return Path(cache_dir) / f"machine-{digest}.json"


def measure() -> tuple[Link, Overhead]:
    from pipeboard.trainer.runtime.links import measure_link
    from pipeboard.trainer.runtime.overhead import calibrate

    return measure_link(), calibrate()


def _about(key: dict[str, Any]) -> dict[str, Any]:
    """What a calibration is for and what it measured: the device, and where they differ, a note."""
    out = {"device": key["device"], "measured_on": MEASURED_ON}
    if key["device"] != MEASURED_ON:
        out["note"] = (f"link and per-action overhead measured between {MEASURED_ON} processes, not on {key['device']}: "
                       "a GPU run's NCCL link and kernel-launch overhead are not measured")
    return out


def calibration(cache_dir: str | Path | None, max_age_s: float,
                device: str = "cpu") -> tuple[Link, Overhead, dict[str, Any]]:
    """The machine's link and overhead for a profile on ``device``: the kept ones when
    ``cache_dir`` holds them for this machine and device and they are at most ``max_age_s`` old,
    else measured now (and kept there). The dict says which ({"measured_at": epoch seconds,
    "reused": bool}) and what for ("device", "measured_on", and a "note" where they differ)."""
    key = machine_key(device)
    path = _path(Path(cache_dir), key) if cache_dir else None
    if path is not None and max_age_s > 0:
        try:
            kept = json.loads(path.read_text())
            age = time.time() - float(kept["measured_at"])
            if kept.get("key") == key and 0 <= age <= max_age_s:
                return (Link.from_dict(kept["link"]), Overhead.from_dict(kept["overhead"]),
                        {"measured_at": kept["measured_at"], "reused": True, **_about(key)})
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
    return link, over, {"measured_at": measured_at, "reused": False, **_about(key)}


def device_note(profile: dict[str, Any] | None, device: str) -> str | None:
    """One line where a profile (its JSON) predicts a run on ``device`` from figures measured
    elsewhere: the profile's layers timed on another device, or its calibration measured on
    another device than the run's; None where they agree (or there is no profile)."""
    if not profile:
        return None
    run = "cuda" if device.startswith("cuda") else "cpu"
    timed = str(profile.get("device", "cpu"))
    timed_kind = "cuda" if timed.startswith("cuda") else "cpu"
    if timed_kind != run:
        return f"predicted from a profile timed on {timed}, for a run on {device}: its figures are not this device's"
    calib = (profile.get("meta") or {}).get("machine_calibration") or {}
    measured_on = calib.get("measured_on", "cpu" if profile.get("link") else None)
    if measured_on is not None and measured_on != run:
        return (f"predicted with a link and per-action overhead measured on {measured_on}, for a run on {device}: "
                "transfer and overhead terms are not this device's")
    return None
