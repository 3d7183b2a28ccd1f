"""Baseline partitioners on hand-made profiles, scored with the planner's cost model."""

from __future__ import annotations

import pytest

from pipeboard.trainer.plan import compare, plan
from pipeboard.trainer.plan.baselines import balanced_bounds, uniform_bounds
from pipeboard.trainer.profile.schema import Layer, Profile


def chain_profile(fwd, params=None, acts=None) -> Profile:
    n = len(fwd)
    layers = [Layer(name=f"l{i}", desc=f"L{i}", forward_ms=fwd[i], backward_ms=2 * fwd[i],
                    activation_bytes=(acts or [1e3] * n)[i], parameter_bytes=(params or [0.0] * n)[i])
              for i in range(n)]
    return Profile(layers=layers, edges=[(f"l{i}", f"l{i + 1}") for i in range(n - 1)], model="chain")


def test_uniform_bounds_split_counts_evenly():
    assert uniform_bounds(10, 4) == [3, 6, 8, 10]
    assert uniform_bounds(4, 4) == [1, 2, 3, 4]


def test_balanced_bounds_minimise_the_largest_part():
    assert balanced_bounds([1, 1, 1, 1, 4, 4], 3) == [4, 5, 6]
    assert balanced_bounds([5, 1, 1, 1, 1, 1], 2) == [1, 6]
    # Fewer natural parts than asked: split further without raising the largest.
    assert len(balanced_bounds([0, 0, 0, 10], 4)) == 4


def test_uniform_plan_on_a_chain():
    prof = chain_profile([1, 1, 1, 1, 6, 6, 6, 6])
    p = plan(prof, [(2, 1e12)], method="uniform")
    assert [st.layers for st in p.stages] == [["l0", "l1", "l2", "l3"], ["l4", "l5", "l6", "l7"]]
    assert [st.workers for st in p.stages] == [[0], [1]]
    # 4 layers of 6 ms forward + 12 ms backward in the second stage; transfers are negligible.
    assert p.predicted_time_s == pytest.approx(0.072, rel=1e-6)
    assert p.method == "uniform" and p.state_graph == "linearised"


def test_time_balanced_plan_evens_out_compute():
    prof = chain_profile([1, 1, 1, 1, 6, 6, 6, 6])
    p = plan(prof, [(2, 1e12)], method="time")
    assert [len(st.layers) for st in p.stages] == [6, 2]  # 4*3 + 2*18 = 48 ms vs 36 ms
    assert p.predicted_time_s == pytest.approx(0.048, rel=1e-6)


def test_params_balanced_plan_evens_out_parameters():
    prof = chain_profile([1] * 6, params=[6e6, 1e6, 1e6, 1e6, 1e6, 2e6])
    p = plan(prof, [(2, 1e12)], method="params")
    assert [st.parameter_bytes for st in p.stages] == [6e6, 6e6]
    assert [len(st.layers) for st in p.stages] == [1, 5]


def test_activation_transfers_slow_a_baseline_down():
    prof = chain_profile([1, 1], acts=[1e9, 1.0])
    p = plan(prof, [(2, 1e9)], method="uniform")
    # Stage 0 sends 1 GB forward and receives its gradient: 2 s at 1 GB/s.
    assert p.stages[0].send_s == pytest.approx(2.0)
    assert p.predicted_time_s == pytest.approx(2.0)
    assert plan(prof, [(2, 1e9)], method="uniform", activation_compression=4.0).predicted_time_s == pytest.approx(0.5)


def test_data_parallel_plan_is_one_stage_on_every_worker():
    prof = chain_profile([1, 2, 3], params=[1e6, 2e6, 1e6])
    p = plan(prof, [(4, 1e9), (2, 1e8)], method="dp")
    assert len(p.stages) == 1 and p.stages[0].workers == list(range(8))
    single = 0.018
    inner = (single + 4 * 3 * 4e6 / (1e9 * 4)) / 4
    expected = (inner + 4 * 1 * 4e6 / (1e8 * 2) / 4) / 2
    assert p.predicted_time_s == pytest.approx(expected, rel=1e-12)
    assert p.data_parallel_time_s == pytest.approx(expected, rel=1e-12)


def test_baselines_use_outer_bandwidth_across_servers():
    prof = chain_profile([1, 1, 1, 1], acts=[1e6] * 4)
    p = plan(prof, [(2, 1e10), (2, 1e8)], method="uniform")
    sends = [st.send_s for st in p.stages]
    assert sends == pytest.approx([2e6 / 1e10, 2e6 / 1e8, 2e6 / 1e10, 0.0])


def test_more_workers_than_layers_leaves_workers_idle():
    p = plan(chain_profile([1, 1]), [(4, 1e9)], method="time")
    assert len(p.stages) == 2 and p.workers_used == 2 and p.total_workers == 4


def test_comparison_puts_pipedream_first_and_never_behind_a_straight_baseline():
    prof = chain_profile([1, 3, 2, 5, 1, 4, 2, 2], params=[1e7, 0, 3e7, 0, 2e7, 0, 1e7, 0])
    plans = compare(prof, [(4, 1e9)])
    assert [p.method for p in plans] == ["pipedream", "uniform", "time", "params", "dp"]
    best = plans[0].predicted_time_s
    # The DP considers every straight 4-stage split and pure data parallelism on a chain.
    assert all(best <= p.predicted_time_s * (1 + 1e-12) for p in plans[1:])
