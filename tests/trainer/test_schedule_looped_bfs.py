"""looped-bfs: torch's order and step counts, the unit-time bubble, memory, and the runtime."""

from __future__ import annotations

import pytest

from pipeboard.trainer.schedule import build, costs_uniform, simulate, validate
from tests.trainer.schedule_runs import runtime_vs_one_process
from pipeboard.trainer.schedule.torch_reference import our_rows, torch_rows, torch_steps, unit_bubble

CONFIGS = [(2, 8), (4, 8), (4, 16)]


@pytest.mark.parametrize("p,m", CONFIGS + [(3, 5), (1, 2)])
def test_compute_order_is_torchs(p, m):
    assert our_rows(build("looped-bfs", p, m)) == torch_rows("looped-bfs", p, m)


@pytest.mark.parametrize("p,m,steps", [(2, 8, 98), (4, 8, 144), (4, 16, 280)])
def test_torchs_unit_step_simulator_counts_the_same_steps_for_both(p, m, steps):
    assert torch_steps(torch_rows("looped-bfs", p, m), p, "loop") == steps
    assert torch_steps(our_rows(build("looped-bfs", p, m)), p, "loop") == steps


@pytest.mark.parametrize("p,m", CONFIGS)
def test_the_unit_time_bubble_is_interleavings_half_of_1f1bs(p, m):
    # two chunks halve each stage's fill and drain: (p - 1) / (2m), as interleaved 1F1B
    assert unit_bubble("looped-bfs", p, m, batch_weight_grads=False) == pytest.approx((p - 1) / (2 * m))
    assert unit_bubble("looped-bfs", p, m, batch_weight_grads=False) == pytest.approx(
        unit_bubble("interleaved-1f1b", p, m, batch_weight_grads=False))


def test_breadth_first_keeps_every_microbatch_of_every_chunk():
    s = build("looped-bfs", 2, 8)
    assert [w.stages for w in s.workers] == [(0, 2), (1, 3)]
    report = validate(s)
    r = simulate(s, costs_uniform(2, fwd_s=1.0, bwd_s=2.0, activation_bytes=1000))
    assert report.peak_activations == r.peak_activations == [16, 16]  # 2 chunks x 8 microbatches
    assert r.peak_memory_bytes is not None


@pytest.mark.parametrize("workers", [2, 4])
def test_runtime_gradients_equal_one_process(tmp_path, workers):
    against_one, trained = runtime_vs_one_process(tmp_path, "looped-bfs", workers)
    assert trained > 1e-4
    assert against_one < 1e-5
