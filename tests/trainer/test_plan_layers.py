"""Layer lists per stage: file order is taken as the topological order when every edge runs
forward in the file (the smallest-index-first order is then file order itself); profiles
listed out of order still get every layer once, producers before consumers."""

from __future__ import annotations

import random

import pytest

from tests.trainer.test_plan_exact import random_profile
from pipeboard.trainer.plan import plan
from pipeboard.trainer.plan.flat_stages import full_topological_order
from pipeboard.trainer.profile.schema import Profile


@pytest.mark.parametrize("seed", range(12))
def test_forward_edges_make_file_order_the_topological_order(seed):
    rng = random.Random(seed)
    profile = random_profile(rng, rng.randrange(2, 30), rng.uniform(0.0, 0.6))
    names = profile.layer_names()
    index = {name: i for i, name in enumerate(names)}
    succ = [[] for _ in names]
    pred = [[] for _ in names]
    for a, b in profile.edges:
        succ[index[a]].append(index[b])
        pred[index[b]].append(index[a])
    assert full_topological_order(len(names), succ, pred) == list(range(len(names)))


@pytest.mark.parametrize("seed", range(12))
def test_out_of_order_profiles_place_every_layer_once_in_order(seed):
    rng = random.Random(50 + seed)
    profile = random_profile(rng, rng.randrange(4, 14), rng.uniform(0.1, 0.5))
    layers = list(profile.layers)
    rng.shuffle(layers)
    shuffled = Profile(layers=layers, edges=list(profile.edges), model="shuffled")
    levels = [(rng.randrange(2, 5), 1e9)]
    ours = plan(shuffled, levels)
    flat = [name for st in ours.stages for name in st.layers]
    assert sorted(flat) == sorted(profile.layer_names())
    position = {name: i for i, name in enumerate(flat)}
    assert all(position[a] < position[b] for a, b in profile.edges)
    assert all(st.layers for st in ours.stages)
