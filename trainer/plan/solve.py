"""Which strategy solves each level, and running them innermost first.

Every strategy gives the plain recurrence's numbers wherever a plan can go (``tests/trainer/
test_plan_strategies.py`` checks each against it); they differ in what they exploit:

- ``plain`` (``recurrence.py``): the reference's loops in pure Python. Taken while NumPy is not
  loaded yet, for problems of at most ``PLAIN_UP_TO`` candidates, which it solves before NumPy
  would have finished importing (so ``pipeboard plan`` on a small model never loads it). Once
  NumPy is loaded (a server, a notebook, the tests) there is nothing left to save, and the
  vectorised strategies are quicker.
- ``top_row`` (``strategies/top_row.py``): the outermost level needs only the block starting at
  state 0: one row, machine count outermost over every state pair at once.
- ``all_rows`` (``strategies/all_rows.py``): a level below the top, every block start at once,
  end by end.
- ``two_machine_top`` (``strategies/two_machine_top.py``): the level just below a two-machine top
  level needs only row 0 and the blocks ending at the last state (one backward pass for all).
- ``capped_chain`` (``strategies/capped_chain.py``, bounds in ``strategies/chain_caps.py``): on a
  chain of two or more levels a bound on the optimum caps how far each block can reach, and the
  levels below the top are solved within the caps by a loop numba compiles. Taken when numba is
  installed and the problem's ``recurrence.work`` is at least ``CAPPED_CHAIN_FROM`` (on smaller
  ones the uncapped levels finish before numba would have imported).

The choice reads what the problem is: its levels, whether its states form a chain, and its
size against those two limits, each set where importing a library starts to pay (measured in
docs/planner.md). ``solve_levels`` also takes the names, so every strategy can be run, and is
tested, on any problem it applies to.
"""

from __future__ import annotations

import math
import sys

from pipeboard.trainer.plan import recurrence
from pipeboard.trainer.plan.formulas import LevelSpec
from pipeboard.trainer.plan.states import StateChain

PLAIN_UP_TO = 100_000  # ``recurrence.work``: what the plain recurrence does in about half NumPy's import time
CAPPED_CHAIN_FROM = 2e8  # ``recurrence.work``: about what the uncapped levels do in numba's import time
GUESS = 1.25  # the capped chain's first bound: this multiple of compute over workers (any guess ends exact)
STRATEGIES = ("plain", "top_row", "all_rows", "two_machine_top", "capped_chain")


def choose(chain: StateChain, specs: list[LevelSpec]) -> list[str]:
    """A strategy name per level (innermost first) for this problem."""
    L, work = len(specs), recurrence.work(chain, specs)
    if "numpy" not in sys.modules and work <= PLAIN_UP_TO:
        return ["plain"] * L
    if L == 1:  # one level: its top row only (nothing below it to import the strategies for)
        return ["top_row"]
    from pipeboard.trainer.plan.strategies import capped_chain, two_machine_top

    capped = chain.is_chain() and work >= CAPPED_CHAIN_FROM and capped_chain.available()
    names = []
    for idx, spec in enumerate(specs):
        if spec.final:
            names.append("top_row")
        elif idx == L - 2 and two_machine_top.applies(spec, specs[-1]):
            names.append("two_machine_top")
        else:
            names.append("capped_chain" if capped else "all_rows")
    return names


def solve_levels(chain: StateChain, specs: list[LevelSpec], strategies: list[str] | None = None,
                 compiled: bool | None = None) -> list:
    """Solved tables, innermost first (the last one's A[0][n-1][M-1] is the optimum).

    ``strategies``: a name per level (default ``choose``); ``compiled``: run the capped chain's
    loop compiled (default: when numba is installed) or as plain Python."""
    names = choose(chain, specs) if strategies is None else list(strategies)
    _check(names, specs, chain)
    if all(name == "plain" for name in names):
        return recurrence.solve_levels(chain, specs)  # (each table's ``strategy`` says "plain")
    from pipeboard.trainer.plan.strategies.arrays import ChainArrays

    a = ChainArrays(chain)
    if "capped_chain" in names:
        from pipeboard.trainer.plan.strategies import capped_chain, chain_caps

        compiled = capped_chain.available() if compiled is None else compiled
        workers = math.prod(s.machines for s in specs)
        guess = chain.compute_s[-1] / workers * GUESS
        if guess > 0:
            found = chain_caps.solve_within(lambda upper: run_levels(chain, a, specs, names, upper, compiled), guess,
                                           chain.size)
            if found is not None:
                return found
        names = ["all_rows" if name == "capped_chain" else name for name in names]  # (no plan at all)
    return run_levels(chain, a, specs, names, None, False)


def _check(names: list[str], specs: list[LevelSpec], chain: StateChain) -> None:
    if len(names) != len(specs) or any(name not in STRATEGIES for name in names):
        raise ValueError(f"strategies: one of {STRATEGIES} per level, got {names}")
    for idx, (name, spec) in enumerate(zip(names, specs)):
        if (name == "top_row") != spec.final and name != "plain":
            raise ValueError(f"strategies: {name!r} cannot solve level {idx + 1} (top_row is for the final level only)")
        if name == "two_machine_top":
            from pipeboard.trainer.plan.strategies import two_machine_top

            if not (idx == len(specs) - 2 and two_machine_top.applies(spec, specs[-1])):
                raise ValueError(f"strategies: two_machine_top does not apply to level {idx + 1}")
        if name == "capped_chain" and not (chain.is_chain() and len(specs) >= 2):
            raise ValueError("strategies: capped_chain needs a chain on two or more levels")


def run_levels(chain: StateChain, a, specs: list[LevelSpec], names: list[str], upper: float | None,
               compiled: bool) -> list:
    """The levels innermost first under the named strategies; ``upper``: the capped chain's
    bound on the optimum (its caps and row bounds are derived from it)."""
    from pipeboard.trainer.plan.strategies import all_rows, capped_chain, top_row, two_machine_top
    from pipeboard.trainer.plan.strategies.arrays import Dense

    if upper is not None:
        from pipeboard.trainer.plan.strategies import chain_caps

        levels = [(s.machines, s.bandwidth) for s in specs]
        bounds, limits = chain_caps.row_bounds(a, levels, upper), chain_caps.limits(a, levels, upper)
    values, tables, caps_below = a.compute, [], None
    for idx, (spec, name) in enumerate(zip(specs, names)):
        if name == "plain":
            table = recurrence.solve_level(chain, spec, _plain_value(values))
            next_values = None if spec.final else Dense(_dense(table.next_value(), chain.size))
        else:
            if name == "top_row":  # (over a capped level, only pairs within its caps have a finite value)
                table = top_row.solve_level(a, spec, values, None if caps_below is None else
                                          top_row.pairs_within(a, caps_below))
            elif name == "all_rows":
                table = all_rows.solve_level(a, spec, values)
            elif name == "two_machine_top":
                table = two_machine_top.solve_level(a, spec, values)
            else:
                caps, end_bounds = limits[idx]
                workers = math.prod(s.machines for s in specs[:idx])
                table = capped_chain.solve_level(a, spec, values, bounds[idx], caps, end_bounds, workers, compiled)
            next_values = None if spec.final else table.next_values()
        caps_below = limits[idx][0] if name == "capped_chain" else None
        table.strategy = name
        tables.append(table)
        values = next_values
    return tables


def _plain_value(values):
    return lambda i, j: values.at(i, j)


def _dense(value, n: int):
    import numpy as np

    return np.array([[value(i, j) for j in range(n)] for i in range(n + 1)], dtype=float)
