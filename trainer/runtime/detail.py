"""Which steps keep their full action timeline, and the compact summary every step keeps.

A long job cannot keep every action of every step (stages x microbatches x steps rows), so the
reporter keeps each step's actions only inside detail windows, as torch.profiler's schedule does:

- the first ``first`` steps of every attempt (so a resumed attempt has a window at its start);
- ``width`` steps every ``every`` steps, at most ``max_periodic`` such windows (a day-long job's
  detail stays within a fixed budget);
- the ``before_failure`` steps before an error (kept in a ring buffer, written only on a failure);
- steps asked for while the job runs (``request(n)``: the next n steps).

Every step, in a window or not, gets one summary: per stage [busy, idle, bubble, transfer, memory,
median F, B, BI, W], seconds rounded to microseconds, memory in bytes. Its size grows with the stages,
never with the microbatches or the steps.
"""

from __future__ import annotations

import os
from collections import defaultdict, deque
from dataclasses import dataclass
from statistics import median
from typing import Any, Iterable

from pipeboard.trainer.schedule.actions import TimelineEvent

# The order of a stage's summary columns; the API and the charts read them by this order.
SUMMARY_COLUMNS = ("busy_s", "idle_s", "bubble_s", "transfer_s", "memory_bytes", "median_F_s", "median_B_s",
                   "median_BI_s", "median_W_s")
MEDIAN_KINDS = ("F", "B", "BI", "W")
TRANSFER_KINDS = {"send_act", "recv_act", "send_grad", "recv_grad"}


@dataclass(frozen=True)
class DetailPolicy:
    first: int = 50
    every: int = 1000
    width: int = 5
    max_periodic: int = 500
    before_failure: int = 10
    max_queued: int = 200_000  # actions waiting for the sink; past it a window's actions are dropped and counted

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "DetailPolicy":
        """PIPEBOARD_DETAIL_FIRST_STEPS, _EVERY, _WIDTH, _MAX_WINDOWS, _BEFORE_FAILURE, _MAX_QUEUED
        (the service passes its settings to the run this way; app/core/config.py documents them)."""
        env = os.environ if env is None else env
        names = {"first": "FIRST_STEPS", "every": "EVERY", "width": "WIDTH", "max_periodic": "MAX_WINDOWS",
                 "before_failure": "BEFORE_FAILURE", "max_queued": "MAX_QUEUED"}
        values: dict[str, int] = {}
        for field, suffix in names.items():
            raw = env.get(f"PIPEBOARD_DETAIL_{suffix}")
            if raw is not None:
                value = int(raw)
                if value < 0:
                    raise ValueError(f"PIPEBOARD_DETAIL_{suffix}: must be 0 or more, got {raw}")
                values[field] = value
        return cls(**values)

    def scheduled(self, step: int, start_step: int) -> bool:
        """Whether ``step`` is in a window the schedule always records."""
        if step - start_step < self.first:
            return True
        if self.every <= 0 or self.width <= 0:
            return False
        return step % self.every < self.width and step // self.every <= self.max_periodic


class DetailWindows:
    """Decides, per completed step, whether its actions are written, held or summarised only."""

    def __init__(self, policy: DetailPolicy) -> None:
        self.policy = policy
        self.start_step = 0
        self.requested_until = -1  # steps up to this one were asked for while running
        self.recent: deque[tuple[int, list[TimelineEvent]]] = deque(maxlen=max(policy.before_failure, 0) or None)
        self.kept_steps: set[int] = set()
        self.dropped_actions = 0
        self.queued = 0

    def request(self, steps: int, last_done: int) -> None:
        self.requested_until = max(self.requested_until, last_done + int(steps))

    def in_window(self, step: int) -> bool:
        return self.policy.scheduled(step, self.start_step) or step <= self.requested_until

    def take(self, step: int, events: list[TimelineEvent]) -> list[TimelineEvent]:
        """The actions of a completed step to write now ([] when outside any window)."""
        if not self.in_window(step):
            if self.policy.before_failure > 0:
                self.recent.append((step, events))
            return []
        return self.admit(step, events)

    def on_failure(self) -> list[TimelineEvent]:
        """The held steps before a failure: written now, so the failure has its window."""
        out: list[TimelineEvent] = []
        while self.recent:
            step, events = self.recent.popleft()
            out.extend(self.admit(step, events))
        return out

    def admit(self, step: int, events: list[TimelineEvent]) -> list[TimelineEvent]:
        """Write a step's actions unless the writer is too far behind (then count them as dropped)."""
        if self.queued + len(events) > self.policy.max_queued:
            self.dropped_actions += len(events)  # the writer is behind: detail goes, the summary stays
            return []
        self.queued += len(events)
        self.kept_steps.add(step)
        return events

    def written(self, count: int) -> None:
        self.queued = max(0, self.queued - count)


def step_summary(events: Iterable[TimelineEvent], stages: list[int], step_start: float, step_end: float,
                 memory: dict[int, float]) -> list[list[float]]:
    """One row per stage in ``stages`` order, columns as SUMMARY_COLUMNS."""
    by_stage: dict[int, list[TimelineEvent]] = defaultdict(list)
    for ev in events:
        by_stage[ev.stage].append(ev)
    span = max(step_end - step_start, 0.0)
    rows = []
    for stage in stages:
        evs = sorted(by_stage.get(stage, []), key=lambda e: e.start)
        kinds: dict[str, list[float]] = defaultdict(list)
        busy = transfer = 0.0
        for ev in evs:
            kind = _kind(ev.kind)
            duration = max(ev.end - ev.start, 0.0)
            if kind in TRANSFER_KINDS:
                transfer += duration
            else:
                busy += duration
                kinds[kind].append(duration)
        covered = _union(evs)
        first = evs[0].start if evs else step_end
        last = max((e.end for e in evs), default=step_end)
        # bubble: gaps between the stage's first and last action; idle: before the first and after the last
        bubble = max((last - first) - covered, 0.0) if evs else 0.0
        idle = max(span - (last - first), 0.0) if evs else span
        row = [busy, idle, bubble, transfer, float(memory.get(stage, 0.0))]
        row += [median(kinds[k]) if kinds.get(k) else 0.0 for k in MEDIAN_KINDS]
        rows.append([round(v, 6) if i != 4 else v for i, v in enumerate(row)])
    return rows


def _union(events: list[TimelineEvent]) -> float:
    total, end = 0.0, float("-inf")
    for ev in events:  # sorted by start
        if ev.end <= end:
            continue
        total += ev.end - max(ev.start, end)
        end = ev.end
    return total


def _kind(kind: Any) -> str:
    return kind.value if hasattr(kind, "value") else str(kind)
