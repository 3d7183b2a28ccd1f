"""One-level plans: the top row on the pairs that can matter (``trainer.plan.onelevel``).

Unpruned, its table must equal ``dp.solve_level``'s entry for entry; pruned by the grid
bound and the compute bands, the plan (objective, stages, replicas, layers) must equal the
unpruned one exactly, with every option, on random DAGs and chains.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.trainer.test_plan_exact import chain_profile, random_profile
from trainer.plan import onelevel, plan
from trainer.plan.dp import LevelOptions, level1_values, solve_level
from trainer.plan.pipedream import tables_of
from trainer.plan.states import state_chain


def _options(seed: int) -> dict:
    return dict(straight=seed % 5 == 0, fewer_workers=seed % 3 == 0,
                memory_bytes=[None, 4e8, 2e9, 1e12][seed % 4], memory_constraint=seed % 4 != 0,
                activation_compression=[1.0, None, 2.0][seed % 7 % 3])


@pytest.mark.parametrize("seed", range(40))
def test_unpruned_top_row_equals_the_per_state_dp(seed):
    rng = random.Random(seed)
    t = tables_of(state_chain(random_profile(rng, rng.randrange(3, 22), rng.uniform(0.0, 0.6))))
    o = _options(seed)
    opt = LevelOptions(machines=rng.randrange(1, 8), bandwidth=rng.choice([1e9, 1e10]), machines_below=1,
                       final=True, straight=o["straight"], fewer_machines=o["fewer_workers"],
                       memory_bytes=o["memory_bytes"] if o["memory_constraint"] else None,
                       activation_compression=o["activation_compression"])
    row = np.zeros(1, dtype=np.intp)
    expected = solve_level(t, level1_values(t), opt, row, caps=np.array([t.size - 1]))
    assert np.array_equal(onelevel.solve_top_row(t, opt, prune=False), expected)


@pytest.mark.parametrize("seed", range(60))
def test_pruned_plans_equal_unpruned_plans(seed, monkeypatch):
    rng = random.Random(1000 + seed)
    if seed % 4 == 3:
        profile = chain_profile(rng, rng.randrange(8, 40))
    else:
        profile = random_profile(rng, rng.randrange(6, 30), rng.uniform(0.05, 0.5))
    levels = [(rng.randrange(2, 9), rng.choice([1e9, 1e10, 1e11]))]
    o = _options(seed)
    monkeypatch.setattr(onelevel, "PRUNE_FROM_WORK", 10**12)
    try:
        plain = plan(profile, levels, **o).to_dict()
    except Exception as exc:  # an infeasible case must stay infeasible
        monkeypatch.setattr(onelevel, "PRUNE_FROM_WORK", 0)
        with pytest.raises(type(exc)):
            plan(profile, levels, **o)
        return
    monkeypatch.setattr(onelevel, "PRUNE_FROM_WORK", 0)
    monkeypatch.setattr(onelevel, "GRID_BUCKETS", rng.choice([1, 2, 4, 16]))
    monkeypatch.setattr(onelevel, "FILTER_BELOW", [1.01, 0.0, 0.4][seed % 3])  # always, never, as planned
    monkeypatch.setattr(onelevel, "GRID_FROM_PAIRS", 0 if seed % 2 else 10**12)
    assert plan(profile, levels, **o).to_dict() == plain


def test_grid_states_are_distinct_ascending_and_never_the_last():
    rng = random.Random(7)
    for _ in range(20):
        t = tables_of(state_chain(random_profile(rng, rng.randrange(6, 26), rng.uniform(0.1, 0.5))))
        grid = onelevel._grid(t)
        assert len(grid) and grid.max() < t.size - 1 and np.all(np.diff(grid) > 0)


def test_pairs_among_some_states():
    rng = random.Random(8)
    for case in range(30):
        profile = random_profile(rng, rng.randrange(3, 26), rng.uniform(0.0, 0.6))
        t = tables_of(state_chain(profile, linearise=case % 3 == 0))
        ends = np.array([rng.random() < 0.5 for _ in range(t.size)])
        starts = np.array([rng.random() < 0.5 for _ in range(t.size)])
        all_k, all_j = t.pairs()
        inside = ends[all_j] & starts[all_k]
        pk, pj = t.pairs_among(ends, starts)
        assert np.array_equal(pk, all_k[inside]) and np.array_equal(pj, all_j[inside])
        assert t.pairs_among(ends, starts, most=inside.sum() - 1) is None or not inside.any()


@pytest.mark.parametrize("zero", ["compute", "everything"])
def test_plans_of_no_time_at_all(zero, monkeypatch):
    # A bound of zero (nothing to compute or send) must not break the pruning's divisions.
    rng = random.Random(11)
    profile = random_profile(rng, 12, 0.3)
    for layer in profile.layers:
        layer.forward_ms = layer.backward_ms = 0.0
        if zero == "everything":
            layer.activation_bytes = layer.parameter_bytes = 0.0
    levels = [(4, 1e9)]
    monkeypatch.setattr(onelevel, "PRUNE_FROM_WORK", 10**12)
    plain = plan(profile, levels).to_dict()
    monkeypatch.setattr(onelevel, "PRUNE_FROM_WORK", 0)
    monkeypatch.setattr(onelevel, "GRID_FROM_PAIRS", 0)
    assert plan(profile, levels).to_dict() == plain
