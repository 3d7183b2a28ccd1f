"""A run's last step reports reach the sink even when they land after the launcher last looked.

A worker puts its final batch of step reports, then "exit", then exits; the launcher may have
drained its channel just before and see every exit code 0 just after. CI lost a 1,000-step job's
last 35 steps that way (2026-12-03)."""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace

from pipeboard.trainer.runtime.launch import _watch
from pipeboard.trainer.runtime.report import Reporter
from pipeboard.trainer.runtime.torchrun_entry import StoreChannel, drain
from pipeboard.trainer.sink import ListSink

WORLD = 2


def ready(rank: int) -> tuple:
    return ("ready", rank, [rank], 0, 1000 + rank, 0, 3, 3, None, "host")


def steps(rank: int, first: int, last: int) -> tuple:
    return ("steps", rank, [(k, 0.01 * (k + 1), 0.005, [0.5] if rank == WORLD - 1 else [], 0, []) for k in range(first, last + 1)])


class LateChannel:
    """Empty on the first look; then everything the workers sent before they exited."""

    def __init__(self, late: list[tuple]) -> None:
        self.late, self.looks = list(late), 0

    def get(self, timeout: float | None = None) -> tuple:
        self.looks += 1
        if self.looks == 1 or not self.late:
            raise queue.Empty
        return self.late.pop(0)

    def get_nowait(self) -> tuple:
        return self.get()


def started_reporter(sink: ListSink) -> Reporter:
    reporter = Reporter(sink, WORLD, batch_size=8, metric_name="accuracy")
    for rank in range(WORLD):
        reporter.handle(ready(rank))
        reporter.handle(steps(rank, 0, 0))
    return reporter


def test_the_launcher_reads_reports_that_land_between_its_last_look_and_the_exits() -> None:
    sink = ListSink()
    reporter = started_reporter(sink)
    late = [steps(r, 1, 2) for r in range(WORLD)] + [("finished", r, 2, 0.03, None, None) for r in range(WORLD)]
    late += [("exit", r) for r in range(WORLD)]
    exited = [SimpleNamespace(exitcode=0, is_alive=lambda: False) for _ in range(WORLD)]
    cfg = SimpleNamespace(hang_timeout_s=60.0)

    heartbeat = [time.perf_counter(), 0.0] * WORLD  # (last beat, waiting on a peer) per rank
    _watch(cfg, exited, LateChannel(late), heartbeat, reporter, layout=None)
    reporter.maybe_flush(force=True)

    assert [r.step for r in sink.metrics] == [1, 2, 3]
    assert reporter.exited == set(range(WORLD))


class DictStore:
    """The part of TCPStore's interface the mailbox uses."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def set(self, key: str, value: bytes) -> None:
        with self.lock:
            self.data[key] = value

    def check(self, keys: list[str]) -> bool:
        with self.lock:
            return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        with self.lock:
            return self.data[key]

    def delete_key(self, key: str) -> bool:
        with self.lock:
            return self.data.pop(key, None) is not None


def test_rank_zero_reads_the_other_ranks_reports_that_come_after_its_own_end() -> None:
    sink = ListSink()
    reporter = started_reporter(sink)
    store = DictStore()
    mailboxes = [StoreChannel(store, r) for r in range(WORLD)]
    for rank in range(WORLD):
        for msg in (steps(rank, 1, 2), ("finished", rank, 2, 0.03, None, None)):
            mailboxes[rank].put(msg)
    mailboxes[0].put(("exit", 0))
    stop = threading.Event()
    stop.set()  # rank 0's own training is over before rank 1 has said its last
    reader = threading.Thread(target=drain, args=(store, WORLD, reporter, stop), daemon=True)
    reader.start()
    reader.join(0.5)
    assert reader.is_alive(), "rank 0 stopped reading before rank 1's exit"
    mailboxes[1].put(steps(1, 3, 3))  # say a last flush came late
    mailboxes[1].put(("exit", 1))
    reader.join(5)
    assert not reader.is_alive()
    reporter.maybe_flush(force=True)
    assert reporter.exited == set(range(WORLD))
    assert [r.step for r in sink.metrics] == [1, 2, 3]
