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
