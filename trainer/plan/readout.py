"""Reading a plan back out of solved levels: each choice re-derived from the table, top down.

No strategy stores its choices (the reference keeps a split and a replica count per entry).
A choice is re-derived instead, as the reference made it: the single stage if it equals the
entry, else the smaller machine count (with ``fewer``), else the first (k, m') in the
reference's order whose candidate equals it. The candidates are recomputed with the cost
model's own arithmetic, so the equality is exact. Any table with ``spec``, ``entry``,
``first_stage`` and ``first_equal`` reads out the same way: the plain recurrence's, and every
strategy's (for which an entry on an optimal path is exact, so the same choices are found).
"""

from __future__ import annotations

import math

from pipeboard.trainer.plan.flat_stages import Leaf


def split(table, i: int, j: int, m: int) -> list[tuple[int, int, int]]:
    """Stages (start, end, replicas), half-open state ranges, of block i..j on m+1 machines."""
    target = table.entry(i, j, m)
    if not math.isfinite(target):
        raise ValueError(f"no feasible split for states {i}..{j} on {m + 1} machines")
    stages = []
    while True:
        spec = table.spec
        if (m == 0 or not spec.straight) and table.first_stage(i, j, m) == target:
            stages.append((i, j + 1, m + 1))
            return stages[::-1]
        if spec.fewer and m > 0 and j > i and table.entry(i, j, m - 1) == target:
            m -= 1
            continue
        found = table.first_equal(i, j, m, target)
        if found is None:
            raise ValueError(f"internal: could not re-derive the split of states {i}..{j} on {m + 1} machines")
        k, r = found
        stages.append((k + 1, j + 1, r))
        j, m = k, m - r
        target = table.entry(i, j, m)


def read_levels(tables: list, n: int) -> list[list[tuple[int, int, int, int]]]:
    """Per level (innermost first): stages (start, end, replicas, first machine in its block).

    The top level splits the whole model; each level below splits each of its blocks again."""
    per_level: list[list[tuple[int, int, int, int]]] = [[] for _ in tables]
    blocks = [(0, n)]
    for lvl in range(len(tables) - 1, -1, -1):
        found = []
        machines = tables[lvl].spec.machines
        for start, end in blocks:
            first = 0
            for s, e, r in split(tables[lvl], start, end - 1, machines - 1):
                found.append((s, e, r, first))
                first += r
        per_level[lvl] = found
        blocks = [(s, e) for s, e, _, _ in found]
    return per_level


def leaves(per_level, n: int) -> list[Leaf]:
    """The flat stages (the innermost level's), with their replicas and place on every level."""
    ends = [{e for _, e, _, _ in stages} for stages in per_level]
    out = []
    for s0, e0, _, _ in per_level[0]:
        replicas, first = [], []
        for stages in per_level:
            _, _, r, f = next(st for st in stages if st[0] <= s0 < st[1])
            replicas.append(r)
            first.append(f)
        cut = -1 if e0 == n else max(lvl for lvl, es in enumerate(ends) if e0 in es)
        out.append(Leaf(s0, e0, replicas, first, cut))
    return out
