"""How often a worker polls the embedded (SQLite) broker: often while idle, so a queued job
starts at once; once a second while it trains a job, when a second's delay before it takes
another matters less than the CPU the training processes share (the polling, ten queries a
second, was most of the worker's CPU during a run). Kombu reads the interval at every drain.
"""

from __future__ import annotations

import threading
from typing import Any

IDLE_POLL_S = 0.1
BUSY_POLL_S = 1.0

_lock = threading.Lock()
_runs = 0  # jobs this process runs now


def run_started() -> None:
    global _runs
    with _lock:
        _runs += 1


def run_ended() -> None:
    global _runs
    with _lock:
        _runs = max(0, _runs - 1)


def interval(_transport: Any = None) -> float:
    return BUSY_POLL_S if _runs else IDLE_POLL_S
