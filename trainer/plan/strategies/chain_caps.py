"""Strategy "capped chain", its bounds: how far each block start of a chain can usefully reach.

Below the top level every block start i needs a value for every end j (the level above reads
any block i..j as one of its stages), which makes those levels cubic in the chain length. On
a chain most of those blocks are too big to be in any plan within an upper bound U on the
optimum; ``limits`` says, per level and block start, the last end that can be (its cap), and
bounds every block and row.

Why it is exact. Write W for the workers of a level's block on all its machines (the product
of the machine counts up to that level). On a chain every entry of a level is at least its
block's compute over its workers (each stage costs at least its compute over its replicas,
and the stages share the machines), so a block i..j with compute c has value v >= c / W. The
level above reads v as a stage on r of its machines at cost (v + a(r) p) / r or more, where p
is the block's parameter bytes and a(r) p its all-reduce (divided by the machines below when
the stage is the whole block, the only form row 0 of a level is read in). That cost and every
entry containing it must stay within the level above's bound, so

    v <= B(p) = max over r of (r * B_above(p) - a(r) p),   with B_top = U,

B_above taken at p although the enclosing block holds at least p: every B falls as p grows,
so this only loosens it. A block with c / W > B(p) (with a relative slack far above float
rounding) is in no plan within U, and since c and p only grow with j, neither is any later
end of the row. An entry past its row's cap, or above its bound, may come out larger than the
reference's, but every candidate it loses exceeds the bound of every entry it could feed: a
candidate is the max of its parts, so a part above a bound only yields a candidate above it.

U comes from ``solve_within``: solve under a guess; a finite result at most the guess is the
optimum (a real plan's value, so at least the optimum, which makes the guess a valid bound); a
larger finite result is itself a valid bound, for one more, exact, pass.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from pipeboard.trainer.plan.strategies.arrays import ChainArrays
from pipeboard.trainer.plan.formulas import allreduce_s

# Relative slack on every bound compared against: far above the rounding of the compute sums,
# so no block of an optimal plan is ever cut off by it.
SLACK = 1 + 1e-9


def _workers(levels) -> int:
    return math.prod(w for w, _ in levels)


def row_bounds(a: ChainArrays, levels, upper: float) -> list[np.ndarray | float]:
    """Per level, per block start, a value above which no entry can matter (+inf: none known).

    The top level reads a block i..j of the level below as ``(v + comm) / m'`` with comm >= 0 and
    m' <= M for i = 0, m' <= M - 1 otherwise (a later stage leaves a machine to the first), and
    the states before block i need ceil(compute / (U * workers per top machine)) machines of
    their own; deeper levels divide a block's bound among their machines."""
    L = len(levels)
    bounds: list[np.ndarray | float] = [math.inf] * L
    if not math.isfinite(upper):
        return bounds
    bounds[-1] = upper * SLACK
    top = levels[-1][0]
    below_top = np.full(a.size + 1, upper * (top - 1) * SLACK)
    below_top[0] = upper * top * SLACK
    before = a.compute.prev  # compute of states 0..i-1, per row i
    needed = np.ceil(before / (upper * SLACK * _workers(levels[:-1])) - 1e-9)
    room = np.maximum(top - np.maximum(needed, 1), 0)
    below_top[1:] = np.minimum(below_top[1:], upper * room[1:] * SLACK)
    bounds[-2] = below_top
    for idx in range(L - 3, -1, -1):
        bounds[idx] = np.maximum.accumulate(bounds[idx + 1]) * levels[idx + 1][0] * SLACK
    return bounds


def _bound_lines(levels, upper: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per level below the top: (bound of row 0's blocks, bound of other rows') as functions of
    a block's parameter bytes p, each the max of lines ``b - s p`` given as an (L, 2) array."""
    L = len(levels)
    row0 = rest = np.array([[upper * SLACK, 0.0]])  # the top level's entries
    out: list = [None] * (L - 1)
    for idx in range(L - 2, -1, -1):
        machines, bw = levels[idx + 1]
        below = levels[idx][0]
        # a(r): the all-reduce per parameter byte, whole block (shared by ``below``) or last stage
        single = [(r, allreduce_s(1.0, r, bw) / below) for r in range(1, machines + 1)]
        last = [(r, allreduce_s(1.0, r, bw)) for r in range(1, machines)]
        above_has_rows = idx + 1 < L - 1  # the top level solves row 0 only
        new_row0 = _scaled(row0, single)
        new_rest = [_scaled(row0, last)]
        if above_has_rows:
            new_rest += [_scaled(rest, single), _scaled(rest, last)]
        row0, rest = envelope(new_row0), envelope(np.concatenate(new_rest))
        out[idx] = (row0, rest)
    return out


def _scaled(lines: np.ndarray, replicas) -> np.ndarray:
    """r * f(p) - a p for each (r, a): the lines (r b, r s + a)."""
    if not replicas:
        return np.zeros((0, 2))
    return np.concatenate([np.column_stack([r * lines[:, 0], r * lines[:, 1] + a]) for r, a in replicas])


def envelope(lines: np.ndarray) -> np.ndarray:
    """The lines of max(b - s p) that are highest somewhere on p >= 0 (the upper envelope).

    Removing a line only ever lowers the max where rounding put two lines within a few ulps of
    each other, far inside the slack ``limits`` adds."""
    order = np.lexsort((-lines[:, 0], lines[:, 1]))  # by slope, then highest intercept first
    pareto, best = [], -math.inf
    for b, s in lines[order]:
        if b > best:  # a higher intercept than every line of smaller or equal slope
            pareto.append((b, s))
            best = b
    hull: list[tuple[float, float]] = []
    for b3, s3 in pareto:  # slopes ascending, intercepts ascending
        while len(hull) >= 2:
            (b1, s1), (b2, s2) = hull[-2], hull[-1]
            # The middle line is above its neighbours only for p in [x23, x12]: empty if x23 >= x12.
            if (b3 - b2) * (s2 - s1) >= (b2 - b1) * (s3 - s2):
                hull.pop()
            else:
                break
        hull.append((b3, s3))
    return np.array(hull).reshape(-1, 2)



def evaluate(lines: np.ndarray, p: np.ndarray) -> np.ndarray:
    """max over the lines of b - s p, elementwise."""
    out = np.full(p.shape, -math.inf)
    for b, s in lines:
        np.maximum(out, b - s * p, out=out)
    return out


def limits(a: ChainArrays, levels, upper: float) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """Per level (None for the top): the caps, per block start i = 0..n the last end state a
    plan within ``upper`` can use (i - 1: none), and the bounds B(p) of every block i..j
    ((n+1, n); they bound every entry of the block, whatever its machine count, since an entry
    is at most the full block's value it feeds and B only falls as the block grows)."""
    n, L = a.size, len(levels)
    compute = a.compute.dense()
    params = a.parameters.dense()
    later = np.arange(n)[None, :] >= np.arange(1, n + 1)[:, None]  # j >= i for rows 1..n
    tol = 1e-9 * upper * _workers(levels)  # far above the rounding of the bounds' sums
    out: list = [None] * L
    workers = 1
    for idx, (lines0, lines_rest) in enumerate(_bound_lines(levels, upper)):
        workers *= levels[idx][0]
        bounds = np.empty((n + 1, n))
        bounds[0] = evaluate(lines0, params[0])
        bounds[1:] = evaluate(lines_rest, params[1:])
        # Rounding: the sums behind p and c may be a few ulps off their true values (a state's
        # down-set summed in another order), so the bounds get a relative and an absolute slack
        # far above that; no test below needs them monotone, only at least the true bound.
        bounds = bounds * SLACK + 1e-6 * upper
        ok0 = compute[0] <= workers * bounds[0] * SLACK + tol
        ok = (compute[1:] <= workers * bounds[1:] * SLACK + tol) & later
        cap = np.empty(n + 1, dtype=np.intp)
        cap[0] = np.flatnonzero(ok0)[-1] if ok0.any() else -1
        last = n - 1 - np.argmax(ok[:, ::-1], axis=1)  # the last usable end of each row
        cap[1:] = np.where(ok.any(axis=1), last, np.arange(n))  # row i without one: i - 1
        out[idx] = (cap, bounds)
    return out


def solve_within(solve_with: Callable[[float], list], guess: float, n: int, attempts: int = 12):
    """Tables from ``solve_with(upper)`` for an upper bound that holds, or None.

    Starts at ``guess`` and stops as soon as a pass's optimum is within its bound (then it is
    exact); a finite optimum above the bound is itself a bound; no plan at all doubles it.
    """
    upper = guess
    for _ in range(attempts):
        tables = solve_with(upper)
        top = tables[-1]
        got = top.entry(0, n - 1, top.spec.machines - 1)
        if got <= upper * SLACK:
            return tables
        upper = got if math.isfinite(got) else upper * 2
    return None
