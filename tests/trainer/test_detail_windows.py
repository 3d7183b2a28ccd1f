"""Every step keeps a compact summary; full actions only inside detail windows."""

from __future__ import annotations

from pipeboard.trainer.runtime.detail import SUMMARY_COLUMNS, DetailPolicy
from pipeboard.trainer.runtime.report import Reporter
from pipeboard.trainer.sink import ListSink

WORLD = 2
MICROBATCHES = 4


def ready(rank: int, start: int = 0, total: int = 100) -> tuple:
    return ("ready", rank, [rank], 0, 1000 + rank, start, total, total, None, "host")


def step(rank: int, k: int, microbatches: int = MICROBATCHES) -> tuple:
    """One 1f1b-like step of stage ``rank``: F and B per microbatch, a send per F, 10 ms a step."""
    t = 0.01 * k + 0.001 * rank
    events = []
    for mb in range(microbatches):
        events.append(("F", rank, mb, t, t + 0.0005, k))
        events.append(("send_act", rank, mb, t + 0.0005, t + 0.0006, k))
        events.append(("B", rank, mb, t + 0.0007, t + 0.0017, k))
        t += 0.002
    return ("step", rank, k, 0.01 * (k + 1), 0.006, [0.5] if rank == WORLD - 1 else [], 1024 * (rank + 1), events)


def run(policy: DetailPolicy, steps: range, *, start: int = 0, microbatches: int = MICROBATCHES, fail_at: int | None = None,
        request_at: tuple[int, int] | None = None) -> tuple[ListSink, Reporter]:
    sink = ListSink()
    reporter = Reporter(sink, WORLD, batch_size=8, metric_name="accuracy", flush_s=0.0, detail=policy)
    for rank in range(WORLD):
        reporter.handle(ready(rank, start))
    for k in steps:
        if request_at and k == request_at[0]:
            reporter.windows.request(request_at[1], k - 1)
        if fail_at is not None and k == fail_at:
            reporter.handle(step(0, k, microbatches))  # rank 1 fails inside this step
            reporter.handle(("error", 1, [1], "RuntimeError", "boom"))
            break
        for rank in range(WORLD):
            reporter.handle(step(rank, k, microbatches))
    reporter.maybe_flush(force=True)
    return sink, reporter


def detail_steps(sink: ListSink) -> set[int]:
    return {e.step for e in sink.events}


def summaries(sink: ListSink) -> dict[int, list[list[float]]]:
    return {r.step - 1: r.values["stages"] for r in sink.metrics if "stages" in r.values}


def test_every_step_is_summarised_but_only_windows_keep_actions() -> None:
    sink, reporter = run(DetailPolicy(first=3, every=20, width=2, before_failure=0), range(0, 45))
    assert detail_steps(sink) == {0, 1, 2, 20, 21, 40, 41}
    assert sorted(summaries(sink)) == list(range(45))
    row = summaries(sink)[10][0]  # stage 0 of step 10
    named = dict(zip(SUMMARY_COLUMNS, row))
    assert named["busy_s"] == 0.006  # 4 x (0.5 ms F + 1 ms B)
    assert named["transfer_s"] == 0.0004
    assert named["median_F_s"] == 0.0005 and named["median_B_s"] == 0.001
    assert named["memory_bytes"] == 1024
    assert named["bubble_s"] > 0 and named["idle_s"] >= 0
    assert reporter.summary(None, True, 1.0)["detail_steps"] == [[0, 2], [20, 21], [40, 41]]


def test_a_summary_does_not_grow_with_the_microbatches() -> None:
    few, _ = run(DetailPolicy(first=0, every=0, before_failure=0), range(0, 5), microbatches=2)
    many, _ = run(DetailPolicy(first=0, every=0, before_failure=0), range(0, 5), microbatches=32)
    assert len(str(summaries(few)[3])) <= len(str(summaries(many)[3])) + 16
    assert len(summaries(many)[3]) == WORLD and all(len(r) == len(SUMMARY_COLUMNS) for r in summaries(many)[3])
    assert not many.events


def test_the_steps_before_a_failure_keep_their_detail() -> None:
    sink, reporter = run(DetailPolicy(first=2, every=0, before_failure=3), range(0, 30), fail_at=25)
    assert detail_steps(sink) == {0, 1, 22, 23, 24, 25}
    assert reporter.windows.dropped_actions == 0


def test_a_resumed_attempt_records_its_first_steps() -> None:
    sink, _ = run(DetailPolicy(first=3, every=0, before_failure=0), range(500, 510), start=500)
    assert detail_steps(sink) == {500, 501, 502}


def test_a_window_requested_while_running_is_recorded() -> None:
    sink, _ = run(DetailPolicy(first=1, every=0, before_failure=0), range(0, 40), request_at=(17, 5))
    assert detail_steps(sink) == {0, 17, 18, 19, 20, 21}


def test_detail_past_the_writers_queue_is_dropped_and_counted_but_summaries_are_not() -> None:
    per_step = WORLD * MICROBATCHES * 3
    policy = DetailPolicy(first=10, every=0, before_failure=0, max_queued=per_step * 2)
    sink = ListSink()
    reporter = Reporter(sink, WORLD, batch_size=8, metric_name="accuracy", flush_s=3600.0, detail=policy)
    for rank in range(WORLD):
        reporter.handle(ready(rank))
    for k in range(10):  # the sink is not flushed: the queue fills after two steps
        for rank in range(WORLD):
            reporter.handle(step(rank, k))
    reporter.maybe_flush(force=True)
    assert detail_steps(sink) == {0, 1}
    assert reporter.windows.dropped_actions == 8 * per_step
    assert sorted(summaries(sink)) == list(range(10))
    assert reporter.summary(None, True, 1.0)["detail_dropped_actions"] == 8 * per_step


def test_bad_detail_settings_are_one_line() -> None:
    import pytest

    with pytest.raises(ValueError, match="PIPEBOARD_DETAIL_EVERY"):
        DetailPolicy.from_env({"PIPEBOARD_DETAIL_EVERY": "-1"})
    assert DetailPolicy.from_env({"PIPEBOARD_DETAIL_FIRST_STEPS": "7"}).first == 7
