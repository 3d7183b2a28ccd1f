"""interleaved-zb: torch's order and step counts, the paper's bubble, memory, and the runtime."""

from __future__ import annotations

import pytest

from pipeboard.trainer.schedule import build, costs_uniform, simulate, validate
from tests.trainer.schedule_runs import runtime_vs_one_process
from pipeboard.trainer.schedule.torch_reference import our_rows, torch_rows, torch_steps, unit_bubble

CONFIGS = [(2, 8), (4, 8), (4, 16)]


@pytest.mark.parametrize("p,m", CONFIGS + [(3, 5), (4, 6), (1, 2)])
def test_compute_order_is_torchs(p, m):
    assert our_rows(build("interleaved-zb", p, m)) == torch_rows("interleaved-zb", p, m)


@pytest.mark.parametrize("p,m,steps", [(2, 8, 113), (4, 8, 151), (4, 16, 283)])
def test_torchs_unit_step_simulator_counts_the_same_steps_for_both(p, m, steps):
    assert torch_steps(torch_rows("interleaved-zb", p, m), p, "loop") == steps
    assert torch_steps(our_rows(build("interleaved-zb", p, m)), p, "loop") == steps


@pytest.mark.parametrize("p,m", CONFIGS)
def test_the_unit_time_bubble_is_a_third_of_interleaved_1f1bs(p, m):
    interleaved = unit_bubble("interleaved-1f1b", p, m, batch_weight_grads=False)
    assert interleaved == pytest.approx((p - 1) / (2 * m))
    assert unit_bubble("interleaved-zb", p, m) == pytest.approx(interleaved / 3)  # as ZB-H1 is a third of 1F1B's


def test_loop_placement_and_memory():
    s = build("interleaved-zb", 4, 8)
    assert [w.stages for w in s.workers] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    report = validate(s)
    r = simulate(s, costs_uniform(4, fwd_s=1.0, bwd_s=2.0, activation_bytes=1000))
    assert report.peak_activations == r.peak_activations
    assert r.peak_memory_bytes is not None and len(r.peak_memory_bytes) == 4


@pytest.mark.parametrize("workers", [2, 4])
def test_runtime_gradients_equal_one_process(tmp_path, workers):
    against_one, trained = runtime_vs_one_process(tmp_path, "interleaved-zb", workers)
    assert trained > 1e-4
    assert against_one < 1e-5
