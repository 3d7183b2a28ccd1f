"""Instrumentation inside a worker: action timings on the run's common clock, memory, and liveness.

``Recorder`` appends one small tuple per executed action (two ``perf_counter`` reads and a list
append, about a microsecond) and hands batches to the reporter; ``bench/runtime.py`` measures its
cost by running with and without it. On a GPU the host clock would time kernel launches, not
kernels (the work is asynchronous), so there ``mark`` records a CUDA event on the current stream
and the action's times are the events' (``CudaClock``): read once per step report, when the
step's last event has completed, and placed on the host clock through an anchor event recorded
at the previous report (so the one host sync is per step, never per action). Times are seconds since the run's origin: every worker
subtracts the same origin (on one machine ``perf_counter`` is the system-wide monotonic clock, so
the launcher's origin is exact; under torchrun each node takes its origin when a start-up barrier
releases, which aligns clocks to within the barrier's skew).

``Heartbeat`` writes, into a shared array the launcher watches, when this worker last made
progress and whether it is blocked waiting for a peer; a worker silent while *not* waiting is
hung, which is how the launcher tells the hung stage from the stages waiting on it.
"""

from __future__ import annotations

import os
import re
import time

import torch

from pipeboard.trainer.schedule.actions import Kind


class CudaClock:
    """CUDA events on ``device``'s current stream, converted to host ``perf_counter`` seconds.

    ``anchor`` synchronizes the device and records an event whose GPU time is taken to be the
    host time read just after it (the stream is idle then, so the event runs at once); an event
    recorded later is at ``anchor_host + anchor.elapsed_time(event) / 1000``. The two clocks
    drift by parts per million, and the anchor is renewed at every step report."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.anchor()

    def anchor(self) -> None:
        torch.cuda.synchronize(self.device)
        self.base = torch.cuda.Event(enable_timing=True)
        self.base.record()
        self.base.synchronize()
        self.base_host = time.perf_counter()

    def mark(self) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, ev: torch.cuda.Event) -> float:
        return self.base_host + self.base.elapsed_time(ev) / 1e3


class Recorder:
    """Action times for the reporter. ``mark()`` is an action's start or end: ``perf_counter``
    seconds on CPU, a CUDA event on a GPU (``record`` takes either; a host time, such as a
    receive's wait, which blocks the CPU, stays one). Events are converted in ``take``."""

    def __init__(self, origin: float, enabled: bool = True, device: torch.device | None = None) -> None:
        self.origin = origin
        self.enabled = enabled
        self.device = device if device is not None else torch.device("cpu")
        self.clock = CudaClock(self.device) if self.device.type == "cuda" else None
        self.events: list[tuple] = []
        self.busy_s = 0.0  # compute time since the last take()
        self.pending: list[tuple] = []  # (kind, stage, mb, t0, t1, step) with CUDA events, until take()

    def mark(self):
        return self.clock.mark() if self.clock is not None else time.perf_counter()

    def record(self, kind: Kind, stage: int, mb: int, t0, t1, step: int) -> None:
        if not isinstance(t1, (int, float)):  # CUDA events: their times are known once the step's work is done
            self.pending.append((kind, stage, mb, t0, t1, step))
            return
        if kind.is_compute:
            self.busy_s += t1 - t0
        if self.enabled:
            self.events.append((kind.value, stage, mb, t0 - self.origin, t1 - self.origin, step))

    def _resolve(self) -> None:
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        pending[-1][4].synchronize()  # one wait per step report: every earlier event is done too
        clock = self.clock
        for kind, stage, mb, t0, t1, step in pending:
            a = t0 if isinstance(t0, (int, float)) else clock.seconds(t0)
            self.record(kind, stage, mb, a, max(a, clock.seconds(t1)), step)
        clock.anchor()  # renew against drift; the stream is idle after the wait above

    def take(self) -> tuple[list[tuple], float]:
        self._resolve()
        events, busy = self.events, self.busy_s
        self.events, self.busy_s = [], 0.0
        if self.clock is not None:
            events.sort(key=lambda e: e[3])
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
        self.meter: MemoryMeter | None = None

    def step_done(self, k: int, recorder: Recorder, last_stage=None, now: bool = False,
                  tokens: int | None = None) -> None:
        """Report step ``k``: the recorder's events and busy time since the last report, the last
        stage's losses, this process's peak memory in the step (``MemoryMeter``), and the step's
        batch's tokens where this worker counts them (the first stage, ``data.token_counter``);
        put at once with ``now``."""
        events, busy = recorder.take()
        if self.meter is None:
            self.meter = MemoryMeter(recorder.device)
        losses = []
        if last_stage is not None:
            held, last_stage.losses = last_stage.losses, []
            # one device-to-host copy for the step's microbatches, not one sync each
            losses = torch.stack(held).float().tolist() if held else []
        self.pending.append((k, recorder.now(), busy, losses, self.meter.take(), events, tokens))
        if now or time.perf_counter() - self.last >= self.every_s:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.channel.put(("steps", self.rank, self.pending))
            self.pending = []
        self.last = time.perf_counter()


# How a stage's measured memory is measured (a run's summary says which, as ``memory_source``).
MEMORY_SOURCES = {
    "cuda_max_allocated": "the CUDA caching allocator's peak bytes allocated in the step "
                          "(torch.cuda.max_memory_allocated, reset at each step report)",
    "counted": "the bytes of the worker's tensors at their peak in the step, counted per storage once "
               "(trainer/runtime/memory_count.py): parameters and stashed weight versions, gradients, optimizer "
               "state, what autograd saved for backward (saved_tensors_hooks), the microbatches in flight and "
               "recompute's rebuilt activations; not the interpreter, torch's libraries or the heap's slack",
    "rss_peak": "the stage process's peak resident memory in the step (Linux VmHWM, reset at each step report "
                "through /proc/self/clear_refs): the interpreter, torch's libraries and freed memory the heap "
                "keeps are in it, so it reads above the tensors' bytes",
    "rss": "the stage process's resident memory at each step report (the kernel refused to reset its peak)",
}


def memory_source(device_kind: str) -> str:
    """How a run's workers on ``device_kind`` measure memory (``MemoryMeter``), as this host's kernel allows."""
    if device_kind == "cuda":
        return "cuda_max_allocated"
    return "counted"


class MemoryMeter:
    """A worker's peak memory since the last ``take``, on its device: the allocator's peak on a
    GPU, the counted bytes of its tensors on CPU (``source="rss_peak"``: the process's peak
    resident memory instead; MEMORY_SOURCES says what each includes)."""

    def __init__(self, device: torch.device, source: str | None = None) -> None:
        self.device = device
        if device.type == "cuda":
            self.source = "cuda_max_allocated"
            torch.cuda.reset_peak_memory_stats(device)
        elif source in (None, "counted"):
            self.source = "counted"
        else:  # the process's resident memory: what a run outside torch's tensors costs the host
            self.source = "rss_peak" if reset_rss_peak() else "rss"

    def take(self) -> int:
        if self.source == "cuda_max_allocated":
            peak = int(torch.cuda.max_memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
            return peak
        if self.source == "counted":
            from pipeboard.trainer.runtime.memory_count import counter

            return counter().take()
        if self.source == "rss_peak":
            peak = _rss_peak()
            reset_rss_peak()
            return max(peak, resident_bytes())
        return resident_bytes()


def _rss_peak() -> int:
    try:
        with open("/proc/self/status") as f:
            m = re.search(r"^VmHWM:\s+(\d+) kB", f.read(), re.M)
        return int(m.group(1)) * 1024 if m else 0
    except OSError:
        return 0


def reset_rss_peak() -> bool:
    """Reset this process's VmHWM to its current resident memory (Linux 4.0+); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _rss_peak() > 0
    except OSError:
        return False


def resident_bytes() -> int:
    """This process's resident memory (Linux), 0 where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
