"""BackgroundSink: batches merged and handed over from its writer thread, in order, errors raised."""

import threading

import pytest

from pipeboard.trainer.schedule.actions import TimelineEvent
from pipeboard.trainer.sink import BackgroundSink, ListSink, MetricRecord


class Recording(ListSink):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int, str]] = []  # (call, size, thread name)

    def on_events(self, events):
        self.calls.append(("events", len(events), threading.current_thread().name))
        super().on_events(events)

    def on_metrics(self, records):
        self.calls.append(("metrics", len(records), threading.current_thread().name))
        super().on_metrics(records)

    def on_status(self, phase, message="", **fields):
        self.calls.append(("status", 0, threading.current_thread().name))
        super().on_status(phase, message, **fields)


def ev(k: int) -> TimelineEvent:
    return TimelineEvent(0, 0, 0, k, "F", k, k + 0.5, step=k)


def test_batches_are_merged_and_go_before_a_status():
    inner = Recording()
    sink = BackgroundSink(inner, period_s=3600)  # the thread never wakes: only the calls hand over
    for k in range(3):
        sink.on_events([ev(k)])
        sink.on_metrics([MetricRecord(step=k + 1, wall_s=k)])
    assert inner.calls == []
    sink.on_status("done")
    assert [c[:2] for c in inner.calls] == [("events", 3), ("metrics", 3), ("status", 0)]
    sink.on_events([ev(3)])
    sink.on_summary({"steps": 4})
    assert [e.microbatch for e in inner.events] == [0, 1, 2, 3] and inner.summary == {"steps": 4}
    sink.on_events([ev(4)])
    sink.close()
    assert [e.microbatch for e in inner.events] == [0, 1, 2, 3, 4]


def test_the_writer_thread_hands_over_each_period():
    inner = Recording()
    sink = BackgroundSink(inner, period_s=0.05)
    sink.on_events([ev(0), ev(1)])
    for _ in range(200):
        if inner.events:
            break
        threading.Event().wait(0.01)
    assert inner.calls and inner.calls[0] == ("events", 2, "sink-writer")
    sink.close()


def test_an_error_in_the_writer_is_raised_by_the_next_call():
    class Failing(ListSink):
        def on_events(self, events):
            raise RuntimeError("database gone")

    sink = BackgroundSink(Failing(), period_s=0.01)
    sink.on_events([ev(0)])
    with pytest.raises(RuntimeError, match="database gone"):
        for _ in range(500):
            threading.Event().wait(0.01)
            sink.on_metrics([])
