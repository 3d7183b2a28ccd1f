"""The cost model's defaults, its scalar/array dispatch and the flat-stage formulas, on numbers
worked out by hand: the cases mutation testing (docs/mutation-testing.md) found untested.

test_plan_costs.py pins each formula; these pin what a caller gets without naming an option
(``LevelSpec``'s and ``level_specs``'s defaults), that ``larger`` and ``unless`` take any mix of
scalars and arrays (and keep Python floats for the pure-Python recurrence, which never loads
NumPy), and the flat stage's all-reduce over three levels and its slowest term.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeboard.trainer.plan import formulas
from pipeboard.trainer.plan.formulas import LevelSpec


def test_a_level_spec_by_default_is_one_unshared_final_level_counting_transfers():
    spec = LevelSpec(4, 1e9)
    assert (spec.sharing, spec.final, spec.straight, spec.fewer, spec.memory, spec.compression) == (
        1, True, False, False, None, 1.0)
    # The defaults as costs: 1 GB of weights on 2 of 4 machines, no sharing: (1 + 4 * 1e9 / 2e9) / 2;
    # a 1 GB input after a cut takes 2 * 1e9 / 1e9 = 2 s, not divided by any compression.
    assert formulas.first_stage_s(spec, 1.0, 1e9, 0.0, 2) == 1.5
    assert formulas.last_stage_s(spec, 0.1, 0.0, 1, 1e9, 0.0) == 2.0


def test_a_level_spec_prints_every_field():
    assert repr(LevelSpec(2, 1.5)) == ("LevelSpec(machines=2, bandwidth=1.5, sharing=1, final=True, straight=False, "
                                       "fewer=False, memory=None, compression=1.0)")
    assert repr(LevelSpec(3, 1e9, 2, False, True, True, 5.0, None)) == (
        "LevelSpec(machines=3, bandwidth=1000000000.0, sharing=2, final=False, straight=True, fewer=True, "
        "memory=5.0, compression=None)")


def test_level_specs_by_default_neither_straighten_nor_compress():
    (spec,) = formulas.level_specs([(4, 1e9)])
    assert (spec.machines, spec.sharing, spec.final) == (4, 1, True)
    assert (spec.straight, spec.fewer, spec.memory, spec.compression) == (False, False, None, 1.0)
    assert list(spec.replica_counts(4)) == [1, 2, 3]  # not straight: any count leaving one machine


def test_larger_takes_any_mix_of_scalars_and_arrays():
    assert formulas.larger(1.0, 2.0) == 2.0 and formulas.larger(3.0, 2.0) == 3.0
    assert type(formulas.larger(1.0, 2.0)) is float  # the pure-Python path stays in floats
    assert formulas.larger(1.0, np.array([0.5, 2.0])).tolist() == [1.0, 2.0]
    assert formulas.larger(np.array([0.5, 2.0]), 1.0).tolist() == [1.0, 2.0]
    assert formulas.larger(np.array([0.5, 3.0]), np.array([1.0, 2.0])).tolist() == [1.0, 3.0]


def test_unless_takes_any_mix_of_scalars_and_arrays():
    # scalars: the value itself (a Python float, NumPy never loaded) or +inf
    assert formulas.unless(False, 2.5) == 2.5 and type(formulas.unless(False, 2.5)) is float
    assert formulas.unless(True, 2.5) == math.inf and type(formulas.unless(True, 2.5)) is float
    # an array condition over a scalar value, and a scalar condition over an array value
    assert formulas.unless(np.array([True, False]), 2.5).tolist() == [math.inf, 2.5]
    assert formulas.unless(True, np.array([1.0, 2.0])).tolist() == [math.inf, math.inf]
    assert formulas.unless(False, np.array([1.0, 2.0])).tolist() == [1.0, 2.0]
    assert formulas.unless(np.array([False, True]), np.array([1.0, 2.0])).tolist() == [1.0, math.inf]


def test_flat_allreduce_is_shared_by_the_replicas_of_every_level_inside():
    # 1 GB of weights, 2 replicas per level: inside a server (10 GB/s) nothing shares it, across
    # servers (1 GB/s) the 2 inner replicas do, across racks (0.1 GB/s) the 2 x 2 inner ones do.
    expected = 4 * 1e9 / (10e9 * 2) + 4 * 1e9 / (1e9 * 2) / 2 + 4 * 1e9 / (1e8 * 2) / 4  # 0.2 + 1 + 5
    assert formulas.flat_allreduce_s(1e9, [2, 2, 2], [10e9, 1e9, 1e8]) == pytest.approx(expected, rel=1e-15)
    assert expected == pytest.approx(6.2)
    # a level with one replica adds nothing but still multiplies the sharing of the levels above
    assert formulas.flat_allreduce_s(1e9, [1, 2, 2], [10e9, 1e9, 1e8]) == pytest.approx(4e9 / 2e9 + 4e9 / 2e8 / 2)


def test_a_flat_stage_takes_its_slowest_term_divided_among_its_replicas():
    assert formulas.flat_stage_s(1.0, 0.5, 2, 0.0, 0.0) == 0.75  # (compute + all-reduce) / 2
    assert formulas.flat_stage_s(1.0, 1.0, 2, 6.0, 0.5) == 3.0  # receiving its input: 6 / 2
    assert formulas.flat_stage_s(1.0, 1.0, 2, 0.5, 6.0) == 3.0  # sending its output: 6 / 2
    assert formulas.flat_stage_s(1.0, 1.0, 4, 2.0, 2.0) == 0.5  # compute + all-reduce: 2 / 4, as are the sends
