"""The capped chain strategy (trainer/plan/strategies/chain_caps.py, capped_chain.py) on chains
long enough for the caps to cut rows short, against the plain recurrence and the uncapped
strategies."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from tests.trainer.test_plan_exact import chain_profile
from pipeboard.trainer.plan import solve
from pipeboard.trainer.plan.strategies import capped_chain, chain_caps
from pipeboard.trainer.plan.strategies.arrays import ChainArrays
from pipeboard.trainer.plan.formulas import level_specs
from pipeboard.trainer.plan.states import state_chain


def _chain(seed: int, layers: int):
    return state_chain(chain_profile(random.Random(seed), layers))


def _objective(tables, chain) -> float:
    return tables[-1].entry(0, chain.size - 1, tables[-1].spec.machines - 1)


def _uncapped(chain, specs):
    names = ["all_rows"] * (len(specs) - 1) + ["top_row"]
    return _objective(solve.solve_levels(chain, specs, names), chain)


@pytest.mark.parametrize("seed,levels,opts", [
    (1, [(4, 100e9), (2, 25e9), (2, 3e9)], {}),
    (2, [(4, 100e9), (2, 25e9), (3, 3e9)], {}),
    (3, [(2, 50e9), (3, 10e9), (2, 2e9)], {"fewer": True}),
    (4, [(4, 100e9), (2, 25e9), (2, 3e9)], {"compression": None}),
    (5, [(2, 100e9), (2, 25e9), (2, 3e9)], {"straight": True}),
    (6, [(3, 100e9), (2, 25e9), (2, 3e9)], {"memory": 4e8}),
    (7, [(2, 100e9), (2, 40e9), (2, 10e9), (2, 1e9)], {}),
    (8, [(4, 100e9), (4, 25e9), (4, 3.125e9)], {"layers": 120}),
    (9, [(4, 10e9), (3, 1e9)], {}),
])
@pytest.mark.parametrize("compiled", [True, False])
def test_capped_chain_equals_the_uncapped_strategies(seed, levels, opts, compiled):
    if compiled and not capped_chain.available():
        pytest.skip("numba not installed")
    opts = dict(opts)
    chain = _chain(seed, opts.pop("layers", 60))
    specs = level_specs(levels, **opts)
    names = ["two_machine_top" if (i == len(levels) - 2 and levels[-1][0] == 2 and not (opts.get("memory") and
                                                                                       opts.get("fewer")))
             else "capped_chain" for i in range(len(levels) - 1)] + ["top_row"]
    full = _uncapped(chain, specs)
    assert math.isfinite(full)
    tables = solve.solve_levels(chain, specs, names, compiled=compiled)
    assert [t.strategy for t in tables] == names  # (the caps held: no fall-back to uncapped levels)
    assert _objective(tables, chain) == full


def test_the_plain_recurrence_agrees_on_a_capped_chain():
    chain = _chain(21, 24)
    specs = level_specs([(2, 100e9), (3, 25e9), (2, 3e9)])
    names = ["capped_chain", "two_machine_top", "top_row"]
    plain = _objective(solve.solve_levels(chain, specs, ["plain"] * 3), chain)
    tables = solve.solve_levels(chain, specs, names, compiled=False)
    assert [t.strategy for t in tables] == names and _objective(tables, chain) == plain


@pytest.mark.parametrize("factor", [0.3, 0.9, 1.0, 1.5, 8.0])
def test_any_first_guess_ends_at_the_optimum(factor):
    # Too low: a pass finds no plan (doubling) or a plan above the guess (a bound for one more
    # pass); high enough: one pass. Every way ends at the uncapped optimum.
    levels = [(4, 100e9), (2, 25e9), (3, 3e9)]
    chain = _chain(11, 50)
    specs = level_specs(levels)
    full = _uncapped(chain, specs)
    names = ["capped_chain", "capped_chain", "top_row"]
    passes = []

    def within(upper):
        passes.append(upper)
        return solve.run_levels(chain, ChainArrays(chain), specs, names, upper, False)

    tables = chain_caps.solve_within(within, full * factor, chain.size)
    assert tables is not None
    assert _objective(tables, chain) == full
    assert (len(passes) == 1) == (factor >= 1.0)


def test_envelope_keeps_the_max_of_all_lines():
    rng = np.random.default_rng(0)
    for _ in range(50):
        lines = np.column_stack([rng.uniform(0, 10, 30), rng.uniform(0, 5, 30)])
        hull = chain_caps.envelope(lines)
        p = rng.uniform(0, 20, 500)
        assert len(hull) < len(lines)
        np.testing.assert_allclose(chain_caps.evaluate(hull, p), chain_caps.evaluate(lines, p), rtol=1e-12)


def test_caps_cut_rows_short_and_bounds_fall_along_a_row():
    levels = [(4, 100e9), (4, 25e9), (4, 3e9)]
    chain = _chain(12, 120)
    full = _uncapped(chain, level_specs(levels))
    limits = chain_caps.limits(ChainArrays(chain), levels, full)
    assert limits[-1] is None and len(limits) == 3
    n = chain.size
    for caps, bounds in limits[:-1]:
        assert caps.shape == (n + 1,) and bounds.shape == (n + 1, n)
        assert (caps[1:n] < n - 1).any(), "some rows should stop before the last state"
        assert (caps[1:n] >= np.arange(1, n) - 1).all()
        for i in range(0, n, 17):
            row = bounds[i, i:]  # a bigger block can only have a smaller bound (up to rounding)
            assert np.all(np.diff(row) <= 1e-12 * np.abs(row).max())
            assert row.min() > 0


def test_no_plan_at_all_falls_back_to_the_uncapped_levels():
    # A straight pipeline needs a stage per worker: 8 workers, 4 states, never a plan.
    levels = [(2, 100e9), (2, 25e9), (2, 3e9)]
    chain = _chain(13, 5)
    specs = level_specs(levels, straight=True)
    assert chain.size < 8
    names = ["capped_chain", "capped_chain", "top_row"]
    within = lambda u: solve.run_levels(chain, ChainArrays(chain), specs, names, u, False)  # noqa: E731
    assert chain_caps.solve_within(within, 1e-3, chain.size, attempts=3) is None
    assert math.isinf(_objective(solve.solve_levels(chain, specs, names, compiled=False), chain))
