"""Keep `pipeboard up`'s children running: restart one that dies, with backoff, and say so.

Each child (the API server, each Celery worker) runs in its own process group. When one exits
while the service is not stopping, the supervisor prints one line naming it and its exit code and
starts it again after a delay that doubles with each quick failure (BASE_DELAY_S, 2x, ... up to
MAX_DELAY_S); a child that ran STABLE_S or longer before dying starts again after BASE_DELAY_S.
The others keep running meanwhile: a dead worker does not take the API (and the dashboard) down,
nor a dead API the workers and their jobs. ``on_exit(child, code)`` runs first, so the service
can react (a worker's running jobs are retried at once instead of after their heartbeats go stale).
"""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

BASE_DELAY_S = 0.5
MAX_DELAY_S = 30.0
STABLE_S = 30.0


def describe_exit(code: int) -> str:
    """'code 1', or 'code -9 (SIGKILL)' for a signal."""
    if code < 0:
        try:
            return f"code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"code {code}"


def restart_delay(quick_failures: int) -> float:
    """Seconds before the next start after ``quick_failures`` exits in a row that came soon after a start."""
    return min(MAX_DELAY_S, BASE_DELAY_S * 2 ** max(0, quick_failures - 1))


@dataclass
class Child:
    """A supervised command: ``name`` as messages say it, ``start()`` starts it (a Popen)."""

    name: str
    start: Callable[[], subprocess.Popen]
    node: str | None = None  # a worker's Celery node name
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    quick_failures: int = 0
    restarts: int = 0
    restart_at: float | None = None
    history: list[int] = field(default_factory=list)  # exit codes, oldest first

    def launch(self, now: float) -> None:
        self.process = self.start()
        self.started_at = now
        self.restart_at = None


class Supervisor:
    def __init__(self, children: list[Child], say: Callable[[str], None],
                 on_exit: Callable[[Child, int], None] | None = None, on_start: Callable[[Child], None] | None = None) -> None:
        self.children = children
        self.say = say
        self.on_exit = on_exit
        self.on_start = on_start

    def start_all(self) -> None:
        now = time.monotonic()
        for child in self.children:
            child.launch(now)

    def processes(self) -> list[subprocess.Popen]:
        return [c.process for c in self.children if c.process is not None]

    def check(self, now: float | None = None) -> None:
        """Notice children that exited (schedule their restart) and start those that are due."""
        now = time.monotonic() if now is None else now
        for child in self.children:
            proc = child.process
            if proc is not None and child.restart_at is None and proc.poll() is not None:
                code = proc.returncode
                child.history.append(code)
                ran = now - child.started_at
                child.quick_failures = child.quick_failures + 1 if ran < STABLE_S else 1
                delay = restart_delay(child.quick_failures)
                child.restart_at = now + delay
                if self.on_exit is not None:
                    try:
                        self.on_exit(child, code)
                    except Exception as exc:  # never let a reaction stop the supervision
                        self.say(f"pipeboard: after {child.name} exited: {type(exc).__name__}: {exc}")
                self.say(f"pipeboard: {child.name} exited with {describe_exit(code)} after {ran:.1f} s; "
                         f"restarting it in {delay:.1f} s (restart {child.restarts + 1})")
            if child.restart_at is not None and now >= child.restart_at:
                child.restarts += 1
                child.launch(now)
                if self.on_start is not None:
                    self.on_start(child)
