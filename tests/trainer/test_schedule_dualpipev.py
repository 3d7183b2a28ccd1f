"""dualpipev: torch's order (its OVERLAP_F_B pairs included) and step counts, the bubble in
sequence and overlapped, memory, and the runtime."""

from __future__ import annotations

import pytest

from pipeboard.trainer.schedule import ScheduleError, build, costs_uniform, simulate, validate
from tests.trainer.schedule_runs import runtime_vs_one_process
from pipeboard.trainer.schedule.torch_reference import our_rows, torch_rows, torch_steps, unit_bubble

CONFIGS = [(2, 8), (4, 8), (4, 16)]
UNIT = dict(fwd_s=1.0, bwd_s=2.0, bwd_input_s=1.0, bwd_weight_s=1.0)


@pytest.mark.parametrize("p,m", CONFIGS + [(3, 7), (1, 2)])
def test_compute_order_is_torchs_pairs_included(p, m):
    ours = our_rows(build("dualpipev", p, m))
    assert ours == torch_rows("dualpipev", p, m)
    assert any(cell.endswith(")OVERLAP_F_B") for row in ours for cell in row) or m == 2 * p and p == 1


@pytest.mark.parametrize("p,m,steps", [(2, 8, 82), (4, 8, 125), (4, 16, 245)])
def test_torchs_unit_step_simulator_counts_the_same_steps_for_both(p, m, steps):
    # (pairs in sequence: torch's simulator cannot schedule a pair)
    assert torch_steps(torch_rows("dualpipev", p, m), p, "v") == steps
    assert torch_steps(our_rows(build("dualpipev", p, m)), p, "v") == steps


@pytest.mark.parametrize("p,m", CONFIGS)
def test_in_sequence_its_unit_time_bubble_is_zbvs_and_overlapped_it_is_shorter(p, m):
    assert unit_bubble("dualpipev", p, m) == pytest.approx(unit_bubble("zbv", p, m))
    s = build("dualpipev", 2 if p == 2 else p, m)
    costs = costs_uniform(p, **UNIT)
    sequence, overlapped = simulate(s, costs), simulate(s, costs, overlap_f_b=True)
    assert overlapped.iteration_time_s < sequence.iteration_time_s
    assert overlapped.extra["overlap_f_b"] is True and sequence.extra["overlap_f_b"] is False


def test_v_placement_pairs_and_memory():
    s = build("dualpipev", 4, 8)
    assert [w.stages for w in s.workers] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    report = validate(s)
    pairs = s.meta["overlap_f_b"]
    assert all(len(mine) > 0 for mine in pairs)
    assert all({fs, bs} == set(s.workers[w].stages) for w, mine in enumerate(pairs) for fs, _, bs, _ in mine)
    r = simulate(s, costs_uniform(4, **UNIT, activation_bytes=1000))
    assert report.peak_activations == r.peak_activations and r.peak_memory_bytes is not None


def test_needs_2p_microbatches_and_two_chunks():
    with pytest.raises(ScheduleError, match=r"dualpipev needs at least as many microbatches as stages \(8\), got 6"):
        build("dualpipev", 4, 6)
    with pytest.raises(ScheduleError, match="exactly two chunks per worker in a V, got chunks=4"):
        build("dualpipev", 2, 8, chunks=4)


@pytest.mark.parametrize("workers", [2, 4])
def test_runtime_gradients_equal_one_process(tmp_path, workers):
    against_one, trained = runtime_vs_one_process(tmp_path, "dualpipev", workers)
    assert trained > 1e-4
    assert against_one < 1e-5
