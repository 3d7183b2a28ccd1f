"""Instrumentation inside a worker: action timings on the run's common clock, and liveness.

``Recorder`` appends one small tuple per executed action (two ``perf_counter`` reads and a list
append, about a microsecond) and hands batches to the reporter; ``bench/runtime.py`` measures its
cost by running with and without it. Times are seconds since the run's origin: every worker
subtracts the same origin (on one machine ``perf_counter`` is the system-wide monotonic clock, so
the launcher's origin is exact; under torchrun each node takes its origin when a start-up barrier
releases, which aligns clocks to within the barrier's skew).

``Heartbeat`` writes, into a shared array the launcher watches, when this worker last made
progress and whether it is blocked waiting for a peer; a worker silent while *not* waiting is
hung, which is how the launcher tells the hung stage from the stages waiting on it.
"""

from __future__ import annotations

import os
import time

import torch

from pipeboard.trainer.schedule.actions import Kind


class Recorder:
    def __init__(self, origin: float, enabled: bool = True) -> None:
        self.origin = origin
        self.enabled = enabled
        self.events: list[tuple] = []
        self.busy_s = 0.0  # compute time since the last take()

    def record(self, kind: Kind, stage: int, mb: int, t0: float, t1: float, step: int) -> None:
        if kind.is_compute:
            self.busy_s += t1 - t0
        if self.enabled:
            self.events.append((kind.value, stage, mb, t0 - self.origin, t1 - self.origin, step))

    def take(self) -> tuple[list[tuple], float]:
        events, busy = self.events, self.busy_s
        self.events, self.busy_s = [], 0.0
        return events, busy

    def now(self) -> float:
        return time.perf_counter() - self.origin


class Heartbeat:
    """Slots ``2 * rank`` (last progress, perf_counter seconds) and ``2 * rank + 1`` (1.0 while
    blocked on communication) of a shared double array; a no-op without one."""

    def __init__(self, array=None, rank: int = 0) -> None:
        self.array = array
        self.i = 2 * rank

    def beat(self) -> None:
        if self.array is not None:
            self.array[self.i] = time.perf_counter()

    def waiting(self, flag: bool) -> None:
        if self.array is not None:
            self.array[self.i] = time.perf_counter()
            self.array[self.i + 1] = 1.0 if flag else 0.0


class StepReports:
    """A worker's step reports to the launcher, put on ``channel`` in batches, at most every
    ``every_s`` seconds and on ``flush``: each put wakes the channel's feeder thread, which then
    competes with training for the GIL and the cores, a cost every step paid while each step's
    report went alone (docs/runtime.md, "Instrumentation"). Batching delays what the launcher
    sees by at most ``every_s``; each report's time is taken when its step ends."""

    def __init__(self, channel, rank: int, every_s: float = 0.25) -> None:
        self.channel, self.rank, self.every_s = channel, rank, every_s
        self.pending: list[tuple] = []
        self.last = time.perf_counter()

    def step_done(self, k: int, recorder: Recorder, last_stage=None, now: bool = False) -> None:
        """Report step ``k``: the recorder's events and busy time since the last report, the last
        stage's losses, this process's memory; put at once with ``now``."""
        events, busy = recorder.take()
        losses = []
        if last_stage is not None:
            held, last_stage.losses = last_stage.losses, []
            # one device-to-host copy for the step's microbatches, not one sync each
            losses = torch.stack(held).float().tolist() if held else []
        self.pending.append((k, recorder.now(), busy, losses, resident_bytes(), events))
        if now or time.perf_counter() - self.last >= self.every_s:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.channel.put(("steps", self.rank, self.pending))
            self.pending = []
        self.last = time.perf_counter()


def resident_bytes() -> int:
    """This process's resident memory (Linux), 0 where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
