"""Small sinks the runtime's callers combine: fan-out to several, and a JSON-lines log.

``JsonlSink`` writes every sink call as one JSON object per line (``{"call": "on_metrics", ...}``),
flushed per call, so another process (a test, a script, the service) can follow a run.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from pipeboard.trainer.schedule.actions import TimelineEvent
from pipeboard.trainer.sink import MetricRecord, Sink


class MultiSink:
    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)

    def on_status(self, phase: str, message: str = "", **fields: Any) -> None:
        for s in self.sinks:
            s.on_status(phase, message, **fields)

    def on_events(self, events: Sequence[TimelineEvent]) -> None:
        for s in self.sinks:
            s.on_events(events)

    def on_metrics(self, records: Sequence[MetricRecord]) -> None:
        for s in self.sinks:
            s.on_metrics(records)

    def on_summary(self, summary: dict[str, Any]) -> None:
        for s in self.sinks:
            s.on_summary(summary)

    def detail_requested(self) -> int:
        """Steps of detail any of the sinks heard asked for (the job page's request reaches the DbSink)."""
        polls = [getattr(s, "detail_requested", None) for s in self.sinks]
        return max((p() for p in polls if callable(p)), default=0)

    def pending_events(self) -> int | None:
        """The most actions any sink still has to write; None when no sink can say."""
        polls = [getattr(s, "pending_events", None) for s in self.sinks]
        counts = [p() for p in polls if callable(p)]
        return max(counts) if counts else None


class JsonlSink:
    def __init__(self, path: str) -> None:
        self.file = open(path, "a", encoding="utf-8")

    def _write(self, obj: dict[str, Any]) -> None:
        self.file.write(json.dumps(obj, default=str) + "\n")
        self.file.flush()

    def on_status(self, phase: str, message: str = "", **fields: Any) -> None:
        self._write({"call": "on_status", "phase": phase, "message": message, "fields": fields})

    def on_events(self, events: Sequence[TimelineEvent]) -> None:
        self._write({"call": "on_events", "events": [e.to_dict() for e in events]})

    def on_metrics(self, records: Sequence[MetricRecord]) -> None:
        self._write({"call": "on_metrics", "records": [
            {"step": r.step, "wall_s": r.wall_s, "epoch": r.epoch, "values": r.values} for r in records]})

    def on_summary(self, summary: dict[str, Any]) -> None:
        self._write({"call": "on_summary", "summary": summary})

    def close(self) -> None:
        self.file.close()
