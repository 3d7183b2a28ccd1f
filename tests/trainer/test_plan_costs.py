"""The cost model (trainer/plan/formulas.py) on numbers worked out by hand.

Every planner path calls these functions, so a wrong constant or a wrong term here would move
every plan; these cases pin each formula to its documented value (docs/plan-format.md), and
the array forms to the scalar ones bit for bit (the vectorised strategies rely on that).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from pipeboard.trainer.plan import formulas
from pipeboard.trainer.plan.formulas import LevelSpec


def test_allreduce_moves_four_times_the_bytes_less_a_replicas_share():
    # 1 GB of weights on 4 replicas at 1 GB/s: 4 * 3 * 1e9 / (1e9 * 4) = 3 s.
    assert formulas.allreduce_s(1e9, 4, 1e9) == 3.0
    assert formulas.allreduce_s(1e9, 1, 1e9) == 0.0  # one copy: nothing to synchronise
    assert formulas.allreduce_s(5e8, 2, 2e9) == 0.5  # 4 * 1 * 5e8 / 4e9


def test_stage_divides_compute_and_shared_allreduce_among_replicas():
    # (1 s + 3 s / 2 workers sharing) / 4 replicas
    assert formulas.stage_s(1.0, 1e9, 4, 1e9, 2) == 0.625
    assert formulas.stage_s(1.0, 1e9, 4, 1e9) == 1.0  # (1 + 3) / 4
    assert formulas.stage_s(0.3, 0.0, 3, 1e9) == 0.3 / 3


def test_transfer_counts_activations_and_their_gradients():
    # 2 x 1 GB over 2 copies' links at 1 GB/s, halved by compression: 0.5 s
    assert formulas.transfer_s(1e9, 2, 1e9, 2.0) == 0.5
    assert formulas.transfer_s(1e9, 1, 1e9, 1.0) == 2.0


def test_last_stage_is_never_below_its_transfers():
    spec = LevelSpec(4, 1e9, compression=1.0)
    # compute 0.1 s, no weights, 1 replica: the 1 GB input (2 s) dominates, the output (0.2 s) does not
    assert formulas.last_stage_s(spec, 0.1, 0.0, 1, 1e9, 1e8) == 2.0
    assert formulas.last_stage_s(spec, 0.1, 0.0, 1, 1e8, 1e9) == 2.0  # output dominates
    assert formulas.last_stage_s(spec, 3.0, 0.0, 1, 1e9, 0.0) == 3.0  # compute dominates
    assert formulas.last_stage_s(spec, 1.0, 1e9, 2, 0.0, 0.0) == 1.5  # (1 + 4 * 1e9 / 2e9) / 2
    uncounted = LevelSpec(4, 1e9, compression=None)
    assert formulas.last_stage_s(uncounted, 0.1, 0.0, 1, 1e9, 1e9) == 0.1
    halved = LevelSpec(4, 1e9, compression=4.0)
    assert formulas.last_stage_s(halved, 0.1, 0.0, 2, 1e9, 0.0) == 0.25  # 2e9 / 2e9 / 4


def test_a_stage_after_a_cut_shares_no_allreduce():
    # Only a block kept whole shares its all-reduce with the machines below (sharing=2 here).
    spec = LevelSpec(4, 1e9, sharing=2, compression=None)
    assert formulas.last_stage_s(spec, 1.0, 1e9, 2, 0.0, 0.0) == 1.5  # (1 + 2) / 2, not (1 + 2 / 2) / 2
    assert formulas.first_stage_s(spec, 1.0, 1e9, 0.0, 2) == 1.0


def test_stash_is_one_copy_per_later_machine_per_replica():
    assert formulas.stash_factor(8, 3, 2) == 3  # ceil(5 / 2)
    assert formulas.stash_factor(8, 5, 4) == 1  # ceil(3 / 4)
    assert formulas.stash_factor(8, 8, 3) == 0  # the last machines stash nothing
    assert formulas.stash_factor(4, 1, 1) == 3
    assert formulas.over_memory(1e9, 3, 2.9e9) and not formulas.over_memory(1e9, 3, 3e9)
    assert formulas.stage_bytes(2e8, 5e8) == 7e8


def test_first_stage_shares_its_allreduce_and_checks_its_stash():
    spec = LevelSpec(4, 1e9, sharing=2, memory=None)
    assert formulas.first_stage_s(spec, 1.0, 1e9, 0.0, 4) == 0.625
    # On 2 of 4 machines the block stashes ceil(2 / 2) = 1 copy of its 1 GB + 0.5 GB.
    tight = LevelSpec(4, 1e9, sharing=1, memory=1.5e9)
    assert formulas.first_stage_s(tight, 1.0, 1e9, 5e8, 2) == (1.0 + 2.0) / 2
    tighter = LevelSpec(4, 1e9, sharing=1, memory=1.49e9)
    assert formulas.first_stage_s(tighter, 1.0, 1e9, 5e8, 2) == math.inf
    assert formulas.first_stage_s(tighter, 1.0, 1e9, 5e8, 4) == 1.0  # on all machines: no stash


def test_data_parallel_time_is_a_single_stage_per_level():
    # 18 ms on 4 workers at 1 GB/s, then 2 servers at 0.1 GB/s sharing among 4 workers.
    inner = (0.018 + 4 * 3 * 4e6 / (1e9 * 4)) / 4
    expected = (inner + 4 * 1 * 4e6 / (1e8 * 2) / 4) / 2
    assert formulas.data_parallel_s(0.018, 4e6, [(4, 1e9), (2, 1e8)]) == expected


def test_flat_stage_costs():
    # replicas 2 inside a server (10 GB/s), 2 servers (1 GB/s) sharing among the inner 2
    assert formulas.flat_allreduce_s(1e9, [2, 2], [10e9, 1e9]) == 4 * 1e9 / 20e9 + 4 * 1e9 / 2e9 / 2
    assert formulas.flat_allreduce_s(1e9, [1, 1], [10e9, 1e9]) == 0.0
    assert formulas.flat_stage_s(1.0, 1.0, 2, 0.5, 6.0) == 3.0
    assert formulas.stage_memory_bytes(1e9, 2e8, 3) == 1.6e9


def test_level_specs_share_by_the_level_below():
    specs = formulas.level_specs([(4, 10e9), (2, 1e9), (3, 1e8)], straight=True, memory=5.0, compression=None)
    assert [(s.machines, s.sharing, s.final) for s in specs] == [(4, 1, False), (2, 4, False), (3, 2, True)]
    assert all(s.straight and s.memory == 5.0 and s.compression is None for s in specs)
    assert list(specs[0].replica_counts(3)) == [1] and list(LevelSpec(4, 1.0).replica_counts(3)) == [1, 2]


@pytest.mark.parametrize("seed", range(5))
def test_array_forms_equal_the_scalar_forms_bit_for_bit(seed):
    rng = random.Random(seed)
    spec = LevelSpec(rng.randrange(2, 9), rng.choice([1e9, 3.125e9]), rng.choice([1, 4]),
                     memory=rng.choice([None, 5e8]), compression=rng.choice([None, 1.0, 2.5]))
    compute = np.array([rng.uniform(0, 0.2) for _ in range(50)])
    params = np.array([rng.choice([0.0, rng.uniform(0, 3e8)]) for _ in range(50)])
    acts = np.array([rng.uniform(0, 3e8) for _ in range(50)])
    out = np.array([rng.uniform(0, 1e8) for _ in range(50)])
    reps = np.arange(1, spec.machines + 1, dtype=float)[:, None]
    first = formulas.first_stage_s(spec, compute[None], params[None], acts[None], reps)
    last = formulas.last_stage_s(spec, compute[None], params[None], reps, out[None], out[::-1][None])
    for r in range(spec.machines):
        for p in range(50):
            assert first[r, p] == formulas.first_stage_s(spec, float(compute[p]), float(params[p]), float(acts[p]), r + 1)
            assert last[r, p] == formulas.last_stage_s(spec, float(compute[p]), float(params[p]), r + 1,
                                                       float(out[p]), float(out[::-1][p]))
