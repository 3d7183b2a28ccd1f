"""The measured time per step: the slope over the second half of the run."""

import pytest

from pipeboard.trainer.schedule.measured import steady_step_s


def test_a_slow_start_does_not_count():
    # ten slow warm-up steps, then 0.1 s a step
    times = {k: 1.0 * (k + 1) for k in range(10)}
    times.update({k: 10.0 + 0.1 * (k - 9) for k in range(10, 30)})
    assert steady_step_s(times) == pytest.approx(0.1)


def test_overlapping_steps_give_their_rate_not_their_gaps():
    # an asynchronous pipeline finishes steps in pairs: gaps alternate 0 and 0.4 s
    times = {k: 0.4 * (k // 2) for k in range(40)}
    assert steady_step_s(times) == pytest.approx(0.2, rel=0.02)


def test_two_steps_are_their_difference_and_fewer_are_none():
    assert steady_step_s({3: 1.0, 4: 1.25}) == pytest.approx(0.25)
    assert steady_step_s({3: 1.0}) is None
    assert steady_step_s({}) is None
    assert steady_step_s({1: 2.0, 2: 2.0}) is None


def test_steps_need_not_start_at_zero():
    # a resumed attempt reports steps from its checkpoint on
    times = {k: 5.0 + 0.05 * k for k in range(100, 140)}
    assert steady_step_s(times) == pytest.approx(0.05)


def test_a_checkpoint_or_evaluation_pause_is_not_a_step():
    # 3 ms steps; after step 20 the run wrote a checkpoint for 0.2 s (measured: 22.7 ms a step before)
    times, t = {}, 0.0
    for k in range(30):
        t += 0.003 + (0.2 if k == 21 else 0.0)
        times[k] = t
    assert steady_step_s(times) == pytest.approx(0.003)
    # two pauses, and an asynchronous pipeline's alternating gaps between them
    times = {k: 0.4 * (k // 2) + (1.0 if k >= 60 else 0.0) + (1.0 if k >= 70 else 0.0) for k in range(80)}
    assert steady_step_s(times) == pytest.approx(0.2, rel=0.03)


def test_steps_that_slow_down_for_good_are_not_pauses():
    # the step time doubles half-way through the tail: a slower steady state, counted
    times = {k: 0.1 * k if k < 30 else 3.0 + 0.2 * (k - 30) for k in range(40)}
    assert 0.12 < steady_step_s(times) < 0.2


def test_a_pause_the_run_reported_is_cut_however_short():
    # 70 ms steps; a 0.22 s checkpoint after step 20 is only 3x a step, under PAUSE_FACTOR
    times, t = {}, 0.0
    for k in range(30):
        t += 0.070 + (0.150 if k == 20 else 0.0)
        times[k] = t
    assert steady_step_s(times) > 0.075  # without the run's word the checkpoint counts
    assert steady_step_s(times, pauses={20}) == pytest.approx(0.070)


def test_the_reporter_marks_the_step_after_a_pause_and_leaves_the_pause_out():
    from pipeboard.trainer.runtime.report import Reporter
    from pipeboard.trainer.schedule.measured import AFTER_PAUSE
    from pipeboard.trainer.sink import ListSink

    sink = ListSink()
    reporter = Reporter(sink, world=1, batch_size=4, metric_name="m")
    t = 0.0
    for k in range(30):
        if k == 20:
            reporter.handle(("pause", 0, 20))  # the worker checkpoints before step 20
            t += 0.150
        t += 0.070
        reporter.handle(("step", 0, k, t, 0.07, [1.0], 0, []))
    reporter.maybe_flush(force=True)
    marked = [r.step for r in sink.metrics if r.values.get(AFTER_PAUSE)]
    assert marked == [21]  # the point of step index 20 (21 steps done)
    assert reporter.summary(None, True, 3.0)["step_s"] == pytest.approx(0.070)
