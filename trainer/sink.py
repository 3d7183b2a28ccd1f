"""How the engine reports progress: a small sink interface the caller supplies.

``trainer`` never knows where reports go. The CLI implements a sink with a progress bar, the
service implements one that writes to the database (and Redis pub/sub), tests collect into lists.
Calls arrive in batches from the process that owns the run (rank 0 gathers the others'), so an
implementation may do I/O per call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

from pipeboard.trainer.schedule.actions import TimelineEvent


@dataclass
class MetricRecord:
    """A point of a run's metric series.

    ``values`` holds what was measured at this point, for example ``loss``, ``metric`` (the
    model's declared metric: accuracy or perplexity), ``samples_per_s``, ``utilization.<stage>``,
    ``memory_bytes.<stage>``.
    """

    step: int
    wall_s: float
    epoch: float = 0.0
    values: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Sink(Protocol):
    def on_status(self, phase: str, message: str = "", **fields: Any) -> None:
        """A lifecycle change or progress line: phase is e.g. 'starting', 'running', 'done'."""

    def on_events(self, events: Sequence[TimelineEvent]) -> None:
        """A batch of measured timeline events."""

    def on_metrics(self, records: Sequence[MetricRecord]) -> None:
        """A batch of metric points."""

    def on_summary(self, summary: dict[str, Any]) -> None:
        """The run's final summary (samples/s, final metric, time to target, ...)."""


class NullSink:
    """Drops everything; the default when a caller wants no reports."""

    def on_status(self, phase: str, message: str = "", **fields: Any) -> None:
        pass

    def on_events(self, events: Sequence[TimelineEvent]) -> None:
        pass

    def on_metrics(self, records: Sequence[MetricRecord]) -> None:
        pass

    def on_summary(self, summary: dict[str, Any]) -> None:
        pass


class ListSink(NullSink):
    """Keeps everything in memory (tests, notebooks)."""

    def __init__(self) -> None:
        self.statuses: list[tuple[str, str, dict[str, Any]]] = []
        self.events: list[TimelineEvent] = []
        self.metrics: list[MetricRecord] = []
        self.summary: dict[str, Any] | None = None

    def on_status(self, phase: str, message: str = "", **fields: Any) -> None:
        self.statuses.append((phase, message, fields))

    def on_events(self, events: Sequence[TimelineEvent]) -> None:
        self.events.extend(events)

    def on_metrics(self, records: Sequence[MetricRecord]) -> None:
        self.metrics.extend(records)

    def on_summary(self, summary: dict[str, Any]) -> None:
        self.summary = dict(summary)
