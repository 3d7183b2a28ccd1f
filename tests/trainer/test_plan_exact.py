"""The planner's recurrence equals a brute-force enumeration of every partition and replication.

The brute force below is written straight from the cost model as docs/plan-format.md states it,
with its own formulas (not ``pipeboard.trainer.plan.formulas``): it lists every chain of states from a block
start to its end (each state a predecessor of the next in the state DAG), every assignment of
replicas to the chain's stages, scores each in plain Python, and keeps the best. Random small
DAGs, one to three levels, with every option, must give the same numbers as the plain
recurrence and as the strategies the planner picks. A wrong constant or term in the cost model
fails here even though every strategy, sharing that model, would still agree with the others.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from pipeboard.trainer.plan import plan
from pipeboard.trainer.plan.pipedream_plan import solve
from pipeboard.trainer.plan.states import state_chain
from pipeboard.trainer.profile.schema import Layer, Profile


def random_profile(rng: random.Random, n_layers: int, edge_p: float) -> Profile:
    layers = [
        Layer(name=f"l{i}", desc="Input" if i == 0 else f"Op{i}", forward_ms=0.0 if i == 0 else rng.uniform(0.1, 5),
              backward_ms=0.0 if i == 0 else rng.uniform(0.1, 8),
              activation_bytes=rng.choice([0.0, rng.uniform(1e5, 4e7)]),
              parameter_bytes=rng.choice([0.0, rng.uniform(1e5, 2e8)]))
        for i in range(n_layers)
    ]
    edges = []
    for v in range(1, n_layers):
        edges.append((f"l{rng.randrange(max(0, v - 2), v)}", f"l{v}"))  # keep it connected
        for u in range(v - 1):
            if rng.random() < edge_p and (f"l{u}", f"l{v}") not in edges:
                edges.append((f"l{u}", f"l{v}"))
    return Profile(layers=layers, edges=edges, model="random")


def chain_profile(rng: random.Random, n_layers: int) -> Profile:
    profile = random_profile(rng, n_layers, 0.0)
    profile.edges = [(f"l{i}", f"l{i + 1}") for i in range(n_layers - 1)]
    return profile


def _block(cum, i, j):
    return cum[j] if i == 0 else cum[j] - cum[i - 1]


def compositions(total: int, parts: int):
    """Every way to write ``total`` as an ordered sum of ``parts`` positive integers."""
    if parts == 1:
        yield (total,)
        return
    for first in range(1, total - parts + 2):
        for rest in compositions(total - first, parts - 1):
            yield (first,) + rest


def brute_level(t, values, M, B, below, rows, straight, fewer, memory, acr):
    """{(i, j): best time of states i..j on M machines} for the given block starts."""
    n = t.size
    preds = [set(t.predecessors(j)) for j in range(n)]
    acts, params, out = list(t.activation), list(t.parameters), list(t.output_activation)

    def first_stage(i, k, c):
        if straight and c > 1:
            return math.inf
        v = values[i][k]
        if v is None:
            return math.inf
        p = _block(params, i, k)
        if memory is not None and math.ceil((M - c) / c) * (_block(acts, i, k) + p) > memory:
            return math.inf
        return (v + (4 * (c - 1) * p) / (B * c) / below) / c

    def stage(k, k2, c, used):
        if straight and c > 1:
            return math.inf
        v = values[k + 1][k2]
        if v is None:
            return math.inf
        p = params[k2] - params[k]
        if memory is not None and (acts[k2] - acts[k] + p) * math.ceil((M - used) / c) > memory:
            return math.inf
        time = (v + (4 * (c - 1) * p) / (B * c)) / c
        if acr is not None:
            time = max(time, 2.0 * out[k] / (B * c) / acr)
            if k2 < n - 1:
                time = max(time, 2.0 * out[k2] / (B * c) / acr)
        return time

    def chains(i, j):
        # Chains i-1 -> k1 -> ... -> j: k1 >= i ends the first stage, later links are DAG edges.
        def extend(path):
            if path[-1] == j:
                yield list(path)
                return
            for nxt in range(path[-1] + 1, j + 1):
                if path[-1] in preds[nxt]:
                    yield from extend(path + [nxt])
        for k1 in range(i, j + 1):
            yield from extend([k1])

    best = {}
    for i in rows:
        for j in range(i, n):
            top = math.inf
            totals = range(1, M + 1) if fewer and j > i else [M]
            for path in chains(i, j):
                s = len(path)
                for total in totals:
                    for reps in compositions(total, s):
                        value = first_stage(i, path[0], reps[0])
                        used = reps[0]
                        for a, b, c in zip(path, path[1:], reps[1:]):
                            used += c
                            value = max(value, stage(a, b, c, used))
                        top = min(top, value)
            best[(i, j)] = top
    return best


def brute_plan(t, levels, straight=False, fewer=False, memory=None, acr=1.0):
    n = t.size
    cum = list(t.compute_s)
    values = [[None] * n for _ in range(n + 1)]
    for i in range(n + 1):
        for j in range(i, n):
            values[i][j] = _block(cum, i, j)
    below = 1
    for idx, (M, B) in enumerate(levels):
        final = idx == len(levels) - 1
        rows = [0] if final else list(range(n))
        best = brute_level(t, values, M, B, below, rows, straight, fewer, memory, acr)
        values = [[None] * n for _ in range(n + 1)]
        for (i, j), v in best.items():
            values[i][j] = None if math.isinf(v) else v
        below = M
    return best[(0, n - 1)]


CASES = [
    # (seed, layers, edge probability, levels, options)
    (1, 5, 0.3, [(3, 1e9)], {}),
    (2, 6, 0.4, [(4, 1e9)], {}),
    (3, 6, 0.5, [(3, 2e9)], {"straight": True}),
    (4, 5, 0.4, [(4, 1e9)], {"fewer": True}),
    (5, 6, 0.3, [(3, 1e9)], {"memory": 3e8}),
    (6, 6, 0.4, [(3, 1e9)], {"acr": None}),
    (7, 5, 0.5, [(2, 10e9), (2, 1e9)], {}),
    (8, 6, 0.3, [(3, 10e9), (2, 1e9)], {}),
    (9, 5, 0.4, [(2, 10e9), (3, 1e9)], {"fewer": True}),
    (10, 5, 0.4, [(2, 10e9), (2, 2e9)], {"memory": 4e8}),
    (11, 5, 0.6, [(2, 10e9), (2, 2e9), (2, 1e9)], {}),
    (12, 7, 0.1, [(2, 10e9), (2, 1e9)], {"straight": True}),
    (15, 6, 0.3, [(6, 1e9)], {}),
    (16, 7, 0.5, [(5, 1e9)], {"fewer": True, "memory": 5e8}),
    (13, 6, 0.5, [(3, 25e9), (2, 3e9)], {"acr": 2.0}),
    (14, 5, 0.0, [(2, 10e9), (2, 5e9), (2, 1e9)], {"fewer": True}),
]


@pytest.mark.parametrize("seed,n_layers,edge_p,levels,opts", CASES)
def test_dp_equals_brute_force(seed, n_layers, edge_p, levels, opts):
    rng = random.Random(seed)
    profile = random_profile(rng, n_layers, edge_p)
    t = state_chain(profile)
    if t.size > 11:
        pytest.skip("too many states for the brute force")
    expected = brute_plan(t, levels, straight=opts.get("straight", False), fewer=opts.get("fewer", False),
                          memory=opts.get("memory"), acr=opts.get("acr", 1.0))
    assert math.isfinite(expected), "each case should have a feasible plan"
    options = dict(memory_bytes=opts.get("memory"), straight=opts.get("straight", False),
                   fewer_workers=opts.get("fewer", False), activation_compression=opts.get("acr", 1.0))
    for strategies in (["plain"] * len(levels), None):  # the plain recurrence, and what the planner picks
        _, got = solve(t, levels, strategies=strategies, **options)
        assert got == pytest.approx(expected, rel=1e-12, abs=0), strategies


@pytest.mark.parametrize("seed", range(20, 32))
def test_random_plans_match_brute_force_and_cover_the_graph(seed):
    rng = random.Random(seed)
    profile = random_profile(rng, rng.randrange(4, 8), rng.uniform(0.1, 0.5))
    levels = rng.choice([[(rng.randrange(1, 5), rng.choice([1e9, 1e10]))],
                         [(rng.randrange(1, 4), 1e10), (rng.randrange(1, 3), 1e9)]])
    t = state_chain(profile)
    if t.size > 9:
        pytest.skip("too many states for the brute force")
    expected = brute_plan(t, levels)
    result = plan(profile, levels)
    assert result.predicted_time_s == pytest.approx(expected, rel=1e-12)
    # Every layer in exactly one stage, and no edge runs backwards through the pipeline.
    stage_of = {name: st.index for st in result.stages for name in st.layers}
    assert sorted(stage_of) == sorted(profile.layer_names())
    assert sum(len(st.layers) for st in result.stages) == len(profile.layers)
    assert all(stage_of[a] <= stage_of[b] for a, b in profile.edges)
    for level in result.levels:  # each level's stages also hold every layer once
        assert sorted(name for st in level.stages for name in st.layers) == sorted(profile.layer_names())
    # Workers: disjoint ranks, as many as replicas, within the cluster.
    ranks = [r for st in result.stages for r in st.workers]
    assert len(ranks) == len(set(ranks)) == result.workers_used <= result.total_workers
    assert all(len(st.workers) == st.replicas for st in result.stages)
    assert all(0 <= r < result.total_workers for r in ranks)
