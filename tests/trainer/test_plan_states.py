"""The planner's state chain against the straightforward forms it replaces for speed.

The antichain walk forms each state's down-set incrementally (the parent's plus the new
node's), each state's sums as its parent's plus the layers its step adds, and the state DAG's
(k, j) pairs come from bitsets through a byte mask rather than ``np.nonzero`` on a dense
matrix; each is checked here against the plain computation.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from tests.shared_data import graph_txt, shared_profiles_dir
from tests.trainer.test_plan_exact import random_profile
from pipeboard.trainer.plan.graph import AntichainWalk, LayerGraph, bit_indices
from pipeboard.trainer.plan.strategies.arrays import ChainArrays
from pipeboard.trainer.plan.states import antichain_states, state_chain
from pipeboard.trainer.profile.files import load_profile


def _plain_walk(graph: LayerGraph) -> tuple[list[list[int]], list[list[int]]]:
    """The walk without its shortcuts: each successor step tested in full, the augmented set
    rebuilt from the kept nodes (as ``AntichainWalk.run`` did before the lone-node path)."""
    walk = AntichainWalk(graph, 10**9)
    anc, desc, succ = walk.anc, _descendants(graph), graph.succ
    start = [graph.sources()[0]]
    first, first_members = walk.augment(start)
    ids = {1 << start[0]: 0}
    augmented, members_of, keys, edges = [first], [first_members], [1 << start[0]], [[]]
    sid = 0
    while sid < len(augmented):
        aug, key, members = augmented[sid], keys[sid], members_of[sid]
        for p, x in enumerate(aug):
            below_others = 0
            for q, y in enumerate(aug):
                if q != p:
                    below_others |= anc[y]
            others = members & ~(1 << x)
            for nxt in succ[x]:
                if (key >> nxt) & 1 or desc[nxt] & members:
                    continue
                new_key = (others | (1 << nxt)) & ~(below_others | anc[nxt])
                if new_key not in ids:
                    ids[new_key] = len(augmented)
                    front = [u for u in (nxt if y == x else y for y in aug) if (new_key >> u) & 1]
                    aug_new, members_new = walk.augment(front)
                    augmented.append(aug_new)
                    members_of.append(members_new)
                    keys.append(new_key)
                    edges.append([])
                edges[sid].append(ids[new_key])
        sid += 1
    return augmented, edges


def _descendants(graph: LayerGraph) -> list[int]:
    """Per layer, the bitset of its strict descendants."""
    desc = [0] * len(graph.names)
    for u in reversed(graph.topological_order()):
        for s in graph.succ[u]:
            desc[u] |= desc[s] | (1 << s)
    return desc


def _plain_downsets(chain) -> list[int]:
    anc = chain.graph.ancestors()
    out = []
    for front in chain.frontiers:
        down = 0
        for u in front:
            down |= anc[u] | (1 << u)
        out.append(down)
    return out


def _plain_sums(chain) -> list[list[float]]:
    g = chain.graph
    per_layer = [[(f + b) / 1000.0 for f, b in zip(g.forward_ms, g.backward_ms)], g.activation, g.parameters]
    return [[math.fsum(values[u] for u in bit_indices(down)) for down in chain.downsets] for values in per_layer]


def _check(chain) -> None:
    assert chain.downsets == _plain_downsets(chain)
    n = chain.size
    for ours, plain in zip([chain.compute_s, chain.activation, chain.parameters], _plain_sums(chain)):
        assert ours == pytest.approx(plain, rel=1e-12, abs=1e-9)  # (summed in another order)
    pairs = [(k, j) for j in range(n) for k in chain.predecessors(j)]
    assert all(k < j for k, j in pairs)  # ancestors come earlier in the order
    # Each step of the walk adds a node outside the down-set, so an ancestor state's down-set
    # is a strict subset (a check of the bitsets from outside them; the rest of _check reads them).
    down = chain.downsets
    assert all(down[k] & ~down[j] == 0 and down[k] != down[j] for k, j in pairs)
    matrix = np.zeros((n, n), dtype=bool)
    for k, j in pairs:
        matrix[j, k] = True
    rows, cols = np.nonzero(matrix)
    pk, pj = ChainArrays(chain).pairs()
    assert pk.dtype == pj.dtype == np.intp
    assert np.array_equal(pj, rows) and np.array_equal(pk, cols)
    assert chain.pair_count() == len(pairs)
    assert chain.is_chain() == all(chain.predecessors(j) == list(range(j)) for j in range(n))


@pytest.mark.parametrize("seed", range(30))
def test_random_dags_down_sets_and_pairs(seed):
    rng = random.Random(seed)
    _check(antichain_states(LayerGraph.from_profile(random_profile(rng, rng.randrange(3, 24), rng.uniform(0.0, 0.6)))))


@pytest.mark.parametrize("seed", range(40))
def test_walk_equals_the_plain_walk(seed):
    rng = random.Random(100 + seed)
    graph = LayerGraph.from_profile(random_profile(rng, rng.randrange(3, 26), rng.uniform(0.0, 0.7)))
    assert AntichainWalk(graph, 10**9).run() == _plain_walk(graph)


@pytest.mark.parametrize("name", ["alexnet", "resnet18", "squeezenet1_0", "gnmt", "resnet50"])
def test_shared_profiles_walk_down_sets_and_pairs(name):
    shared_profiles_dir()
    graph = LayerGraph.from_profile(load_profile(graph_txt(name)))
    assert AntichainWalk(graph, 10**9).run() == _plain_walk(graph)


@pytest.mark.parametrize("name", ["alexnet", "resnet18", "squeezenet1_0", "gnmt"])
def test_shared_profiles_down_sets_and_pairs(name):
    shared_profiles_dir()
    chain = state_chain(load_profile(graph_txt(name)))
    assert chain.kind == "antichain"
    _check(chain)


def test_linearised_chain_pairs_and_sums():
    rng = random.Random(5)
    chain = state_chain(random_profile(rng, 12, 0.4), linearise=True)
    assert chain.kind == "linearised" and chain.is_chain() and chain.ancestor_bits is None
    rows, cols = np.nonzero(np.tri(chain.size, chain.size, -1, dtype=bool))
    pk, pj = ChainArrays(chain).pairs()
    assert np.array_equal(pk, cols) and np.array_equal(pj, rows)
    for ours, plain in zip([chain.compute_s, chain.activation, chain.parameters], _plain_sums(chain)):
        assert ours == pytest.approx(plain, rel=1e-12, abs=1e-9)
    assert chain.sent_after[:-1] == chain.output_activation[:-1] and chain.sent_after[-1] == 0.0


def test_bits_lists_every_set_bit_ascending():
    rng = random.Random(9)
    for _ in range(400):
        width = rng.randrange(0, 600)
        mask = rng.getrandbits(width) if width else 0
        if rng.random() < 0.4:
            mask &= rng.getrandbits(width) if width else 0  # sparser masks too
        assert bit_indices(mask) == [i for i in range(width) if (mask >> i) & 1]
