"""Every strategy against the plain recurrence, on random profiles, clusters and options.

The plain recurrence (trainer/plan/recurrence.py) is the reference's loops; each faster strategy
must give its numbers: entry for entry where the strategy fills a table outright, and the same
optimum and the same plan (stages, replicas, layers) where it only promises the entries an
optimal plan can use. Hypothesis draws the cases (derandomised: the same cases every run).
"""

from __future__ import annotations

import itertools
import math
import random
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.trainer.test_plan_exact import chain_profile, random_profile
from pipeboard.trainer.plan import recurrence, solve
from pipeboard.trainer.plan.strategies import all_rows, top_row, two_machine_top
from pipeboard.trainer.plan.strategies.arrays import ChainArrays, Dense
from pipeboard.trainer.plan.formulas import LevelSpec, level_specs
from pipeboard.trainer.plan.plan_error import PlanError
from pipeboard.trainer.plan.pipedream_plan import pipedream_plan
from pipeboard.trainer.plan.states import state_chain

CASES = settings(max_examples=60, deadline=None, derandomize=True, database=None)


@st.composite
def problems(draw, chains=False, max_layers=11):
    """(state chain, profile, a random LevelSpec draw function's inputs)."""
    seed = draw(st.integers(0, 10**6))
    rng = random.Random(seed)
    n_layers = draw(st.integers(2, max_layers))
    chain_only = chains or draw(st.booleans())
    profile = chain_profile(rng, n_layers) if chain_only else random_profile(rng, n_layers, draw(st.floats(0, 0.7)))
    return state_chain(profile), profile


def specs_of(draw_or_rng, machines: int, below: int, final: bool) -> LevelSpec:
    pick = draw_or_rng
    return LevelSpec(machines, pick([1e9, 1e10, 2.5e10]), below, final, straight=pick([False, False, True]),
                     fewer=pick([False, True]), memory=pick([None, None, 3e8, 1e9]),
                     compression=pick([1.0, None, 2.0]))


def plain_level(chain, spec, value):
    return recurrence.solve_level(chain, spec, value, range(chain.size + 1) if not spec.final else None)


def dense_of(value, n):
    return Dense(np.array([[value(i, j) for j in range(n)] for i in range(n + 1)]))


@CASES
@given(problems(), st.integers(1, 7), st.integers(0, 11), st.sampled_from([1, 3, 64, top_row.SLAB_ENTRIES]),
       st.randoms(use_true_random=False))
def test_top_row_equals_the_plain_row(problem, machines, row, slab, rnd):
    chain, _ = problem
    spec = specs_of(rnd.choice, machines, 1, True)
    row = min(row, chain.size)
    plain = recurrence.solve_row(chain, spec, recurrence.level1_value(chain), row)
    a = ChainArrays(chain)
    got = top_row.solve_row(a, spec, a.compute, row, slab_entries=slab)
    assert np.array_equal(got, np.array(plain).reshape(chain.size, machines))


@CASES
@given(problems(), st.integers(1, 5), st.integers(1, 4), st.randoms(use_true_random=False))
def test_all_rows_equal_the_plain_level(problem, machines, below, rnd):
    # Level 1 on compute sums, then a level above it on the first level's full blocks.
    chain, _ = problem
    a = ChainArrays(chain)
    inner = specs_of(rnd.choice, below, 1, False)
    plain_inner = plain_level(chain, inner, recurrence.level1_value(chain))
    got_inner = all_rows.solve_level(a, inner, a.compute)
    for i in range(chain.size + 1):
        assert np.array_equal(got_inner.row(i), np.array(plain_inner.rows[i]).reshape(chain.size, below))
    outer = specs_of(rnd.choice, machines, below, False)
    plain_outer = plain_level(chain, outer, plain_inner.next_value())
    got_outer = all_rows.solve_level(a, outer, got_inner.next_values())
    for i in range(chain.size + 1):
        assert np.array_equal(got_outer.row(i), np.array(plain_outer.rows[i]).reshape(chain.size, machines))


@CASES
@given(problems(), st.integers(2, 5), st.randoms(use_true_random=False))
def test_two_machine_top_gives_every_block_the_top_reads(problem, machines, rnd):
    chain, _ = problem
    a = ChainArrays(chain)
    spec, top = specs_of(rnd.choice, machines, 1, False), LevelSpec(2, 1e9, machines)
    if not two_machine_top.applies(spec, top):
        spec.memory = None
    plain = plain_level(chain, spec, recurrence.level1_value(chain))
    got = two_machine_top.solve_level(a, spec, a.compute)
    n, last = chain.size, machines - 1
    assert np.array_equal(got.row(0), np.array(plain.rows[0]).reshape(n, machines))
    values = got.next_values().table
    assert np.array_equal(values[0], [plain.entry(0, j, last) for j in range(n)])
    assert np.array_equal(values[1:n, n - 1], [plain.entry(i, n - 1, last) for i in range(1, n)])
    assert np.array_equal(got.row(n - 1), np.array(plain.rows[n - 1]).reshape(n, machines))  # (on demand)


def _combinations(chain, specs):
    """Every valid strategy per level, combined (plain mixes with the others)."""
    per = []
    for idx, spec in enumerate(specs):
        names = ["plain", "top_row"] if spec.final else ["plain", "all_rows"]
        if idx == len(specs) - 2 and two_machine_top.applies(spec, specs[-1]):
            names.append("two_machine_top")
        per.append(names)
    out = [list(c) for c in itertools.product(*per)]
    if chain.is_chain() and len(specs) >= 2:  # the capped levels take every non-final level but two_machine_top's
        out.append(["two_machine_top" if (i == len(specs) - 2 and "two_machine_top" in per[i]) else "capped_chain"
                    for i in range(len(specs) - 1)] + ["top_row"])
    return out


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(problems(max_layers=9), st.lists(st.tuples(st.integers(1, 5), st.sampled_from([1e9, 1e10])), min_size=1,
                                       max_size=3), st.booleans(), st.randoms(use_true_random=False))
def test_every_strategy_gives_the_same_plan(problem, levels, two_at_top, rnd):
    chain, profile = problem
    if two_at_top and len(levels) >= 2:
        levels[-1] = (2, levels[-1][1])
    opts = dict(straight=rnd.random() < 0.2, fewer_workers=rnd.random() < 0.3, memory_constraint=rnd.random() < 0.3,
                memory_bytes=rnd.choice([3e8, 1e9, 4e9]), activation_compression=rnd.choice([1.0, None, 2.0]))
    specs = level_specs(levels, opts["straight"], opts["fewer_workers"], 1.0 if opts["memory_constraint"] else None)
    results = []
    for names in _combinations(chain, specs):
        try:
            results.append((names, pipedream_plan(profile, levels, strategies=names, **opts).to_dict()))
        except PlanError as exc:
            results.append((names, str(exc)))
    for names, got in results[1:]:
        assert got == results[0][1], (names, results[0][0])


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(problems(chains=True, max_layers=40), st.lists(st.tuples(st.integers(1, 4), st.sampled_from([1e9, 25e9])),
                                                       min_size=2, max_size=4), st.randoms(use_true_random=False))
def test_capped_chain_interpreted_and_compiled_equal_the_plain_plan(problem, levels, rnd):
    chain, profile = problem
    opts = dict(straight=rnd.random() < 0.15, fewer_workers=rnd.random() < 0.3,
                memory_bytes=rnd.choice([None, 4e8]), activation_compression=rnd.choice([1.0, None]))
    specs = level_specs(levels, opts["straight"], opts["fewer_workers"], opts["memory_bytes"],
                        opts["activation_compression"])
    plain = solve.solve_levels(chain, specs, ["plain"] * len(specs))
    names = ["capped_chain"] * (len(specs) - 1) + ["top_row"]
    n, top = chain.size, specs[-1].machines - 1
    optimum = plain[-1].entry(0, n - 1, top)
    for compiled in (False, True):
        got = solve.solve_levels(chain, specs, names, compiled=compiled)
        assert got[-1].entry(0, n - 1, top) == optimum
        # (with no plan at all no bound holds, and the uncapped levels answer instead)
        assert ([t.strategy for t in got] == names) == math.isfinite(optimum)


def test_the_choice_reads_what_the_problem_is():
    flat = state_chain(random_profile(random.Random(3), 9, 0.4))
    assert "numpy" in sys.modules  # (the tests load it: nothing to save, so no plain recurrence here)
    one = level_specs([(4, 1e9)])
    assert solve.choose(flat, one) == ["top_row"]
    assert solve.choose(flat, level_specs([(4, 1e9), (4, 1e8)])) == ["all_rows", "top_row"]
    assert solve.choose(flat, level_specs([(4, 1e9), (2, 1e8)])) == ["two_machine_top", "top_row"]
    memory_fewer = level_specs([(4, 1e9), (2, 1e8)], fewer=True, memory=1e9)
    assert solve.choose(flat, memory_fewer) == ["all_rows", "top_row"]
    long = state_chain(chain_profile(random.Random(4), 600))
    three = level_specs([(4, 1e10), (4, 1e9), (3, 1e8)])
    assert recurrence.work(long, three) >= solve.CAPPED_CHAIN_FROM > recurrence.work(long, level_specs([(2, 1e9)] * 2))
    from pipeboard.trainer.plan.strategies import capped_chain

    expected = "capped_chain" if capped_chain.available() else "all_rows"
    assert solve.choose(long, three) == [expected, expected, "top_row"]
    assert solve.choose(long, level_specs([(8, 1e9), (4, 1e8)])) == [expected, "top_row"]
    assert solve.choose(long, level_specs([(2, 1e9), (2, 1e8), (3, 1e7)])) == ["all_rows", "all_rows", "top_row"]
    assert solve.choose(long, level_specs([(4, 1e9), (2, 1e8)])) == ["two_machine_top", "top_row"]
    assert solve.choose(flat, three) == ["all_rows", "all_rows", "top_row"]  # (not a chain)


def test_small_plans_need_no_numpy_and_large_ones_no_plain_recurrence():
    code = ("import sys; from pipeboard.trainer.plan import plan; from pipeboard.trainer.plan.solve import choose; "
            "from pipeboard.trainer.plan.states import state_chain; from pipeboard.trainer.plan.formulas import level_specs; "
            "from pipeboard.trainer.profile.schema import Layer, Profile\n"
            "def chain(n): return Profile([Layer(f'l{i}', 'L', 1.0 + i % 3, 2.0, 1e6, 1e6 * (i % 2)) "
            "for i in range(n)], [(f'l{i}', f'l{i + 1}') for i in range(n - 1)])\n"
            "print(plan(chain(12), [(4, 1e9)]).method, 'numpy' in sys.modules)\n"
            "print(choose(state_chain(chain(200)), level_specs([(8, 1e9)])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["pipedream False", "['top_row']"]


@pytest.mark.parametrize("names,match", [
    (["top_row", "top_row"], "final level only"),
    (["plain", "all_rows"], "final level only"),
    (["two_machine_top", "top_row", "top_row"], "cannot solve|does not apply"),
    (["fastest", "top_row"], "one of"),
    (["top_row"], "one of"),
])
def test_misplaced_strategies_are_refused(names, match):
    chain = state_chain(random_profile(random.Random(5), 6, 0.3))
    specs = level_specs([(3, 1e9), (4, 1e8)] if len(names) != 3 else [(3, 1e9), (4, 1e8), (2, 1e7)])
    with pytest.raises(ValueError, match=match):
        solve.solve_levels(chain, specs, names)
