"""How the engine reports progress: a small sink interface the caller supplies.

``trainer`` never knows where reports go. The CLI implements a sink with a progress bar, the
service implements one that writes to the database (and Redis pub/sub), tests collect into lists.
Calls arrive in batches from the process that owns the run (rank 0 gathers the others'), so an
implementation may do I/O per call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

from pipeboard.trainer.hostinfo import lower_this_thread
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


class BackgroundSink:
    """Hands ``events`` and ``metrics`` batches to ``inner`` from a writer thread of low CPU
    priority, merged into one call of each per ``period_s``: a sink that does I/O (a database)
    then costs the run's processes one short wake-up a period instead of a transaction per batch,
    and yields the CPU to them. ``on_status`` and ``on_summary`` first hand over what is pending,
    then go through at once (in order). An error the writer met is raised by the next call;
    ``close`` hands over the rest and stops the thread."""

    def __init__(self, inner: Any, period_s: float = 1.0, niceness: int = 10) -> None:
        import threading

        self.inner = inner
        self.period_s = period_s
        self.niceness = niceness
        self._events: list[TimelineEvent] = []
        self._metrics: list[MetricRecord] = []
        self._pending = threading.Lock()  # the buffers
        self._writing = threading.Lock()  # calls into inner, one at a time, in order
        self._error: BaseException | None = None
        self._detail_requested = 0  # steps of detail the inner sink heard asked for (read by the writer thread)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sink-writer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        lower_this_thread(self.niceness)
        while not self._stop.wait(self.period_s):
            try:
                self._hand_over()
            except BaseException as exc:  # kept for the caller's next call
                self._error = exc
                return

    def _hand_over(self) -> None:
        with self._writing:
            with self._pending:
                events, self._events = self._events, []
                metrics, self._metrics = self._metrics, []
            if events:
                self.inner.on_events(events)
            if metrics:
                self.inner.on_metrics(metrics)
            poll = getattr(self.inner, "detail_requested", None)
            steps = poll() if callable(poll) else 0
            if steps:
                with self._pending:
                    self._detail_requested = max(self._detail_requested, steps)

    def detail_requested(self) -> int:
        """Steps of detail asked for since the last call (the writer thread asks the inner sink, so
        the run's thread never waits for it)."""
        with self._pending:
            steps, self._detail_requested = self._detail_requested, 0
        return steps

    def pending_events(self) -> int:
        """Actions handed over but not yet written: how far the writer is behind."""
        with self._pending:
            return len(self._events)

    def _raise_pending_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def on_events(self, events: Sequence[TimelineEvent]) -> None:
        self._raise_pending_error()
        with self._pending:
            self._events.extend(events)

    def on_metrics(self, records: Sequence[MetricRecord]) -> None:
        self._raise_pending_error()
        with self._pending:
            self._metrics.extend(records)

    def on_status(self, phase: str, message: str = "", **fields: Any) -> None:
        self._raise_pending_error()
        self._hand_over()
        with self._writing:
            self.inner.on_status(phase, message, **fields)

    def on_summary(self, summary: dict[str, Any]) -> None:
        self._raise_pending_error()
        self._hand_over()
        with self._writing:
            self.inner.on_summary(summary)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._raise_pending_error()
        self._hand_over()
        if hasattr(self.inner, "close"):
            self.inner.close()
