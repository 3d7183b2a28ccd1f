"""The single-row solve (machine count outermost, all pairs at once) against the per-state DP.

``bymachines.solve_one_row`` gathers each machine count's prefix once, masks the memory check
once per stash factor and shares one division between the input and output transfers; the
per-end-state path of ``dp.solve_level`` (taken when block caps are given: here caps that
exclude nothing) forms every candidate separately. Both must give the same table, entry for
entry, with every option.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.trainer.test_plan_exact import random_profile
from trainer.plan.dp import LevelOptions, level1_values, solve_level
from trainer.plan.pipedream import tables_of
from trainer.plan.states import state_chain


@pytest.mark.parametrize("seed", range(48))
def test_one_row_equals_the_per_state_dp(seed, monkeypatch):
    rng = random.Random(seed)
    t = tables_of(state_chain(random_profile(rng, rng.randrange(3, 22), rng.uniform(0.0, 0.6))))
    if seed % 4 == 1:
        monkeypatch.setattr("trainer.plan.bymachines._SLAB_ENTRIES", rng.choice([1, 3, 8]))
    opt = LevelOptions(machines=rng.randrange(2, 8), bandwidth=rng.choice([1e9, 1e10]), machines_below=1,
                       final=True, straight=seed % 5 == 0, fewer_machines=seed % 3 == 0,
                       memory_bytes=[None, 3e8, 2e9, 1e12][seed % 4],
                       activation_compression=[1.0, None, 2.0, 0.5][seed % 7 % 4])
    row = np.zeros(1, dtype=np.intp)
    values = level1_values(t)
    fast = solve_level(t, values, opt, row)
    plain = solve_level(t, values, opt, row, caps=np.array([t.size - 1]))
    assert np.array_equal(fast, plain)
    if opt.memory_bytes != 3e8:  # (a tight limit may leave no block that fits)
        assert np.isfinite(fast[:, :, 0]).any()


@pytest.mark.parametrize("seed", range(12))
def test_single_stage_value_equals_the_array_form(seed):
    from trainer.plan.dp import single_stage_costs, single_stage_value

    rng = random.Random(300 + seed)
    t = tables_of(state_chain(random_profile(rng, rng.randrange(3, 16), rng.uniform(0.0, 0.5))))
    values = level1_values(t)
    acts, params = t.block_sums()
    opt = LevelOptions(machines=rng.randrange(1, 9), bandwidth=rng.choice([1e9, 1e10]), machines_below=rng.choice([1, 2, 8]),
                       final=True, memory_bytes=[None, 3e8, 2e9][seed % 3])
    for i in range(t.size):
        for j in range(i, t.size):
            for m in range(opt.machines):
                array = float(single_stage_costs(values, acts, params, opt, i, slice(j, j + 1), m)[0])
                assert single_stage_value(values, acts, params, opt, i, j, m) == array
