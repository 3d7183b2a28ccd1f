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
