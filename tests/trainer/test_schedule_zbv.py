"""zbv (ZB-V): torch's order, torch's step counts, the paper's bubble, memory, and the runtime."""

from __future__ import annotations

import pytest

from pipeboard.trainer.schedule import ScheduleError, build, costs_uniform, simulate, validate
from tests.trainer.schedule_runs import runtime_vs_one_process
from pipeboard.trainer.schedule.torch_reference import our_rows, torch_rows, torch_steps, unit_bubble

CONFIGS = [(2, 8), (4, 8), (4, 16)]


@pytest.mark.parametrize("p,m", CONFIGS + [(2, 2), (3, 5), (1, 2)])
def test_compute_order_is_torchs(p, m):
    assert our_rows(build("zbv", p, m)) == torch_rows("zbv", p, m)


@pytest.mark.parametrize("p,m,steps", [(2, 8, 94), (4, 8, 133), (4, 16, 269)])
def test_torchs_unit_step_simulator_counts_the_same_steps_for_both(p, m, steps):
    assert torch_steps(torch_rows("zbv", p, m), p, "v") == steps
    assert torch_steps(our_rows(build("zbv", p, m)), p, "v") == steps


@pytest.mark.parametrize("p,m", CONFIGS)
def test_the_papers_unit_time_bubble_is_a_sixth_of_1f1bs(p, m):
    one_f_one_b = unit_bubble("1f1b", p, m, batch_weight_grads=False)
    assert one_f_one_b == pytest.approx((p - 1) / m)
    assert unit_bubble("zbv", p, m) == pytest.approx((p - 1) / (6 * m))  # the fill of one half-stage forward
    assert unit_bubble("zbv", p, m) < unit_bubble("zb-h1", p, m) < one_f_one_b


def test_v_placement_and_memory():
    s = build("zbv", 4, 8)
    assert [w.stages for w in s.workers] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    report = validate(s)
    r = simulate(s, costs_uniform(4, fwd_s=1.0, bwd_s=2.0, activation_bytes=1000, weight_bytes=10))
    assert r.peak_memory_bytes is not None and len(r.peak_memory_bytes) == 4
    # ZB-V keeps about 2p half-stage activations on every worker, as 1F1B's first stage keeps p whole ones
    assert report.peak_activations == r.peak_activations
    assert max(r.peak_activations) <= 2 * 4


def test_two_chunks_exactly():
    with pytest.raises(ScheduleError, match="zbv places exactly two chunks per worker in a V, got chunks=3"):
        build("zbv", 2, 8, chunks=3)


@pytest.mark.parametrize("workers", [2, 4])
def test_runtime_gradients_equal_one_process(tmp_path, workers):
    against_one, trained = runtime_vs_one_process(tmp_path, "zbv", workers)
    assert trained > 1e-4
    assert against_one < 1e-5
