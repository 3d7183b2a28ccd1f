"""Long chains on three or more levels: the last block end each block start can usefully reach.

Below the top level every block start i needs a value for every end j (the level above reads
any block i..j as one of its stages), which makes those levels cubic in the chain length. On
a chain most of those blocks are too big to be in any plan within an upper bound U on the
optimum, and ``caps`` says, per level and block start, the last end that can be.

Why it is exact. Write W for the workers of a level's block on all its machines (the product
of the machine counts up to that level). On a chain every entry of a level is at least its
block's compute over its workers (each stage costs at least its compute over its replicas, and
the stages share the machines), so a block i..j with compute c has value v >= c / W. The
level above reads v as a stage on r of its machines at cost (v + a(r) p) / r or more, where p
is the block's parameter bytes and a(r) p the reference's all-reduce term: 4(r-1)p / (bw r),
divided by the machines below when the stage is the whole block (its "single stage" form,
the only one row 0 of a level is read through). That cost and every entry containing it must
stay within the level above's bound, so

    v <= B(p) = max over r of (r * B_above(p) - a(r) p),   with B_top = U,

where B_above is evaluated at p although the enclosing block holds at least p: every B is
non-increasing in p, so this only loosens it. Row 0 and rows >= 1 get separate bounds (row 0 is
read only through the single-stage form, and only by row 0 above; the other rows as single
stages of their own row above, when the level above has rows beyond 0, and as last stages of
any row). A block with c / W > B(p) (with a relative slack far above float rounding) is
therefore in no plan within U, and since c and p only grow with j, every later end of the row
is out too. An entry past its row's cap may then come out larger than the reference's (it may
read such a block), but every candidate it loses exceeds the bound of every entry it could
feed, so each entry within U is exact (the argument of ``dp.solve_level``'s ``bound``).

U itself comes from ``solve_within``: solve under a guess; a finite result at most the guess is
the optimum (it is a real plan's value, so at least the optimum, which makes the guess a valid
bound); a larger finite result is a valid bound for one more, exact, pass.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from trainer.plan.cluster import total_workers
from trainer.plan.dp import SLACK, Tables


def _bound_lines(levels, upper: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per level below the top: (bound of row 0's blocks, bound of other rows') as functions of
    a block's parameter bytes p, each the max of lines ``b - s p`` given as an (L, 2) array."""
    L = len(levels)
    row0 = rest = np.array([[upper * SLACK, 0.0]])  # the top level's entries
    out: list = [None] * (L - 1)
    for idx in range(L - 2, -1, -1):
        machines, bw = levels[idx + 1]
        below = levels[idx][0]
        single = [(r, 4 * (r - 1) / (bw * r * below)) for r in range(1, machines + 1)]
        last = [(r, 4 * (r - 1) / (bw * r)) for r in range(1, machines)]
        above_has_rows = idx + 1 < L - 1  # the top level solves row 0 only
        new_row0 = _scaled(row0, single)
        new_rest = [_scaled(row0, last)]
        if above_has_rows:
            new_rest += [_scaled(rest, single), _scaled(rest, last)]
        row0, rest = _envelope(new_row0), _envelope(np.concatenate(new_rest))
        out[idx] = (row0, rest)
    return out


def _scaled(lines: np.ndarray, replicas) -> np.ndarray:
    """r * f(p) - a p for each (r, a): the lines (r b, r s + a)."""
    if not replicas:
        return np.zeros((0, 2))
    return np.concatenate([np.column_stack([r * lines[:, 0], r * lines[:, 1] + a]) for r, a in replicas])


def _envelope(lines: np.ndarray) -> np.ndarray:
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


def _evaluate(lines: np.ndarray, p: np.ndarray) -> np.ndarray:
    out = np.full(p.shape, -math.inf)
    for b, s in lines:
        np.maximum(out, b - s * p, out=out)
    return out


def limits(tables: Tables, levels, upper: float) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """Per level (None for the top): the caps, per block start i = 0..n the last end state a
    plan within ``upper`` can use (i - 1: none), and the bounds B(p) of every block i..j
    ((n+1, n); they bound every entry of the block, whatever its machine count, since an entry
    is at most the full block's value it feeds and B only falls as the block grows)."""
    n, L = tables.size, len(levels)
    compute = tables.compute_sums()
    _, params = tables.block_sums()
    later = np.arange(n)[None, :] >= np.arange(1, n + 1)[:, None]  # j >= i for rows 1..n
    tol = 1e-9 * upper * total_workers(levels)  # far above the rounding of the bounds' sums
    out: list = [None] * L
    workers = 1
    for idx, (lines0, lines_rest) in enumerate(_bound_lines(levels, upper)):
        workers *= levels[idx][0]
        bounds = np.empty((n + 1, n))
        bounds[0] = _evaluate(lines0, params[0])
        bounds[1:] = _evaluate(lines_rest, params[1:])
        # Rounding: the sums behind p and c may be a few ulps off their true values (a state's
        # down-set summed in another order), so the bounds get a relative and an absolute slack
        # far above that; no test below needs them monotone, only at least the true bound.
        bounds = bounds * SLACK + 1e-6 * upper
        ok0 = compute[0] <= workers * bounds[0] * SLACK + tol
        ok = (compute[1:] <= workers * bounds[1:] * SLACK + tol) & later
        cap = np.empty(n + 1, dtype=np.intp)
        cap[0] = np.nonzero(ok0)[0][-1] if ok0.any() else -1
        last = n - 1 - np.argmax(ok[:, ::-1], axis=1)  # the last usable end of each row
        cap[1:] = np.where(ok.any(axis=1), last, np.arange(n))  # row i without one: i - 1
        out[idx] = (cap, bounds)
    return out


def solve_within(solve_with: Callable[[float], list], guess: float, n: int, attempts: int = 12):
    """Solutions from ``solve_with(upper)`` for an upper bound that holds, or None.

    Starts at ``guess`` and stops as soon as a pass's optimum is within its bound (then it is
    exact); a finite optimum above the bound is itself a bound; no plan at all doubles it.
    """
    upper = guess
    for _ in range(attempts):
        solutions = solve_with(upper)
        got = solutions[-1].best(0, n - 1)
        if got <= upper * SLACK:
            return solutions
        upper = got if math.isfinite(got) else upper * 2
    return None
