"""What machine this is, for reports that must say where they were measured (the processor
changes between machines, and every benchmark prints it)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def usable_cores() -> int:
    """The cores this process may run on (its affinity; a container or `taskset` can give fewer
    than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def lower_this_thread(niceness: int) -> None:
    """Raise the calling thread's nice value (Linux gives each thread its own), so that it yields
    the core to the threads it shares a process or session with; a no-op where it cannot."""
    import threading

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
    except (AttributeError, OSError):
        pass


def cpu_name() -> str:
    """The processor as /proc/cpuinfo names it (vendor, family, model), else platform's guess."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or "unknown processor"
    return (f"{fields.get('model name', '?')} ({fields.get('vendor_id', '?')}, "
            f"family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})")
