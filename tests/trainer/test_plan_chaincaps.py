"""Long chains on three or more levels: the capped solve (trainer/plan/chaincap.py) against the
straightforward DP (every row, every block, no pruning) on chains where that is cheap."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from trainer.plan import banded, chaincap
from trainer.plan.chainkernel import available as chainkernel_available
from trainer.plan.pipedream import solve_chain_within, solve_levels, tables_of
from trainer.plan.states import state_chain
from tests.trainer.test_plan_exact import chain_profile

BASE = dict(memory_bytes=None, straight=False, fewer_workers=False, activation_compression=1.0)


def _chain_tables(seed: int, layers: int):
    return tables_of(state_chain(chain_profile(random.Random(seed), layers)))


def _objective(solutions, t) -> float:
    return solutions[-1].best(0, t.size - 1)


@pytest.mark.parametrize("seed,levels,opts", [
    (1, [(4, 100e9), (2, 25e9), (2, 3e9)], {}),
    (2, [(4, 100e9), (2, 25e9), (3, 3e9)], {}),
    (3, [(2, 50e9), (3, 10e9), (2, 2e9)], {"fewer_workers": True}),
    (4, [(4, 100e9), (2, 25e9), (2, 3e9)], {"activation_compression": None}),
    (5, [(2, 100e9), (2, 25e9), (2, 3e9)], {"straight": True}),
    (6, [(3, 100e9), (2, 25e9), (2, 3e9)], {"memory_bytes": 4e8}),
    (7, [(2, 100e9), (2, 40e9), (2, 10e9), (2, 1e9)], {}),
    (8, [(4, 100e9), (4, 25e9), (4, 3.125e9)], {"layers": 120}),
])
@pytest.mark.parametrize("compiled", [True, False])
def test_capped_chain_equals_the_straightforward_dp(seed, levels, opts, compiled, monkeypatch):
    # compiled: bands and the windowed loop (chainkernel); else the NumPy DP under the same caps.
    if compiled and not chainkernel_available():
        pytest.skip("numba not installed")
    banded_levels = []
    if compiled:
        monkeypatch.setattr("trainer.plan.banded.FROM_STATES", 0)
        real_banded = banded.solve_banded
        monkeypatch.setattr(banded, "solve_banded", lambda *a: banded_levels.append(a[2].machines) or real_banded(*a))
    else:
        monkeypatch.setattr("trainer.plan.chainkernel.available", lambda: False)
    calls = []
    real = chaincap.solve_within
    monkeypatch.setattr(chaincap, "solve_within", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    monkeypatch.setattr("trainer.plan.pipedream.DIRECT_BELOW", 0)
    monkeypatch.setattr("trainer.plan.dp.BY_MACHINES_UP_TO", 0)
    opts = dict(opts)
    t = _chain_tables(seed, opts.pop("layers", 60))
    options = {**BASE, **opts}
    full = _objective(solve_levels(t, levels, prune=False, shortcuts=False, **options), t)
    capped = _objective(solve_levels(t, levels, **options), t)
    assert calls, "the capped path should have been taken"
    # Every level below the top is banded, except one a two-machine top level solves by suffix.
    assert bool(banded_levels) == compiled
    assert math.isfinite(full)
    assert capped == full


@pytest.mark.parametrize("factor", [0.3, 0.9, 1.0, 1.5, 8.0])
def test_any_first_guess_ends_at_the_optimum(factor):
    # Too low: a pass finds no plan (doubling) or a plan above the guess (a bound for one more
    # pass); high enough: one pass. Every way ends at the straightforward DP's optimum.
    levels = [(4, 100e9), (2, 25e9), (3, 3e9)]
    t = _chain_tables(11, 50)
    full = _objective(solve_levels(t, levels, prune=False, shortcuts=False, **BASE), t)
    passes = []

    def within(upper):
        passes.append(upper)  # (NumPy DP under the caps: this chain is below banded.FROM_STATES)
        return solve_chain_within(t, levels, BASE, upper, False)

    solutions = chaincap.solve_within(within, full * factor, t.size)
    assert solutions is not None
    assert _objective(solutions, t) == full
    assert (len(passes) == 1) == (factor >= 1.0)


def test_envelope_keeps_the_max_of_all_lines():
    rng = np.random.default_rng(0)
    for _ in range(50):
        lines = np.column_stack([rng.uniform(0, 10, 30), rng.uniform(0, 5, 30)])
        hull = chaincap._envelope(lines)
        p = rng.uniform(0, 20, 500)
        assert len(hull) < len(lines)
        np.testing.assert_allclose(chaincap._evaluate(hull, p), chaincap._evaluate(lines, p), rtol=1e-12)


def test_caps_cut_rows_short_and_bounds_fall_along_a_row():
    levels = [(4, 100e9), (4, 25e9), (4, 3e9)]
    t = _chain_tables(12, 120)
    full = _objective(solve_levels(t, levels, prune=False, shortcuts=False, **BASE), t)
    limits = chaincap.limits(t, levels, full)
    assert limits[-1] is None and len(limits) == 3
    n = t.size
    for caps, bounds in limits[:-1]:
        assert caps.shape == (n + 1,) and bounds.shape == (n + 1, n)
        assert (caps[1:n] < n - 1).any(), "some rows should stop before the last state"
        assert (caps[1:n] >= np.arange(1, n) - 1).all()
        for i in range(0, n, 17):
            row = bounds[i, i:]  # a bigger block can only have a smaller bound (up to rounding)
            assert np.all(np.diff(row) <= 1e-12 * np.abs(row).max())
            assert row.min() > 0


def test_no_plan_at_all_gives_up_after_the_attempts():
    # A straight pipeline needs a stage per worker: 8 workers, 4 states, never a plan.
    levels = [(2, 100e9), (2, 25e9), (2, 3e9)]
    t = _chain_tables(13, 5)
    options = {**BASE, "straight": True}
    assert t.size < 8
    assert chaincap.solve_within(lambda u: solve_chain_within(t, levels, options, u, False), 1e-3, t.size,
                                 attempts=3) is None
    assert math.isinf(_objective(solve_levels(t, levels, **options), t))
