"""Antichain states (the reference's, in its order) and the linearised fallback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.shared_data import graph_txt, shared_profiles_dir
from pipeboard.trainer.plan.graph import LayerGraph, StateLimitExceeded
from pipeboard.trainer.plan.states import antichain_states, linearised_states, state_chain
from pipeboard.trainer.plan import PlanError
from pipeboard.trainer.profile.schema import Layer, Profile
from pipeboard.trainer.profile.files import load_profile


def profile_of(edges, times=None, acts=None, params=None, descs=None) -> Profile:
    names = sorted({n for e in edges for n in e}, key=lambda s: int(s[1:]))
    layers = [Layer(name=n, desc=(descs or {}).get(n, n), forward_ms=(times or {}).get(n, 1.0), backward_ms=0.0,
                    activation_bytes=(acts or {}).get(n, 10.0), parameter_bytes=(params or {}).get(n, 0.0))
              for n in names]
    return Profile(layers=layers, edges=list(edges))


DIAMOND = [("n0", "n1"), ("n0", "n2"), ("n1", "n3"), ("n2", "n3")]


def test_diamond_has_the_five_antichain_states():
    chain = antichain_states(LayerGraph.from_profile(profile_of(DIAMOND)))
    names = chain.graph.names
    downsets = [{names[u] for u in range(4) if (d >> u) & 1} for d in chain.downsets]
    # The reference's order: breadth-first discovery, then reverse post-order from the source.
    assert downsets == [{"n0"}, {"n0", "n2"}, {"n0", "n1"}, {"n0", "n1", "n2"}, {"n0", "n1", "n2", "n3"}]
    assert chain.size == 5 and chain.kind == "antichain"
    # n0's output is still needed while only one branch has run: it stays in the frontier.
    one_branch = [i for i, d in enumerate(downsets) if len(d) == 2]
    assert all(0 in chain.frontiers[i] for i in one_branch)
    assert chain.output_activation[one_branch[0]] == 20.0  # n0 and the branch node
    assert list(chain.compute_s) == [0.001 * len(d) for d in downsets]
    # The two one-branch states are incomparable; everything precedes the last state.
    a, b = one_branch
    assert a not in chain.predecessors(b) and b not in chain.predecessors(a)
    assert chain.predecessors(4) == [0, 1, 2, 3]
    assert not chain.is_chain()


def test_reference_clean_up_drops_inputs_and_getitem_sinks():
    prof = profile_of([("n0", "n1"), ("n1", "n2"), ("n1", "n3")], descs={"n0": "Input0", "n3": "__getitem__"})
    g = LayerGraph.from_profile(prof)
    assert [g.names[u] for u in g.removed_inputs] == ["n0"]
    assert [g.names[u] for u in g.removed_sinks] == ["n3"]
    assert antichain_states(g).size == 2


def test_linearised_order_counts_every_crossing_tensor():
    chain = linearised_states(LayerGraph.from_profile(profile_of(DIAMOND, acts={"n0": 1.0, "n1": 2.0, "n2": 4.0})))
    assert chain.kind == "linearised" and chain.is_chain()
    # Cuts after n0: n0; after n1: n0 (still needed by n2) and n1; after n2: n1 and n2.
    assert list(chain.output_activation[:3]) == [1.0, 3.0, 6.0]


def test_state_limit_falls_back_to_a_linear_order():
    wide = [("n0", f"n{i}") for i in range(1, 9)] + [(f"n{i}", "n9") for i in range(1, 9)]
    prof = profile_of(wide)
    with pytest.raises(StateLimitExceeded):
        state_chain(prof, max_states=20, linearise=False)
    chain = state_chain(prof, max_states=20)
    assert chain.kind == "linearised" and chain.size == 10
    assert state_chain(prof, max_states=1000).kind == "antichain"


def test_a_cycle_is_a_plan_error():
    with pytest.raises(PlanError, match="cycle"):
        LayerGraph.from_profile(profile_of([("n0", "n1"), ("n1", "n2"), ("n2", "n1")]))


def _reference_states():
    out = {}
    for line in (shared_profiles_dir() / "reference-plans.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out[rec["profile"]] = rec["ref"]["states"]
    return out


@pytest.mark.parametrize("name", ["alexnet", "vgg16", "resnet18", "squeezenet1_0", "resnet50", "resnext50",
                                  "resnet101", "resnext101", "densenet121", "gnmt", "gnmt_large"])
def test_state_counts_equal_the_reference(name):
    chain = state_chain(load_profile(graph_txt(name)))
    assert chain.kind == "antichain"
    assert chain.size == _reference_states()[name]
    # Down-sets grow along every state-DAG edge and the last state holds every planned layer.
    pairs = [(k, j) for j in range(chain.size) for k in chain.predecessors(j)][:500]
    assert all(chain.downsets[a] & chain.downsets[b] == chain.downsets[a] for a, b in pairs)
    assert chain.downsets[-1] == chain.graph.alive


@pytest.mark.parametrize("name", ["inception_v3", "nasnetamobile"])
def test_exploding_profiles_are_linearised(name):
    chain = state_chain(load_profile(graph_txt(name)), max_states=500)
    assert chain.kind == "linearised"
    assert chain.size == len(chain.graph.names) - len(chain.graph.removed_inputs) - len(chain.graph.removed_sinks)


def test_importing_the_planner_does_not_import_torch_or_numpy():
    # NumPy loads only with a vectorised strategy (trainer/plan/solve.py); torch never.
    code = ("import sys, pipeboard.trainer.plan.graph, pipeboard.trainer.plan, pipeboard.trainer.plan.pipedream_plan, "
            "pipeboard.trainer.plan.baselines, pipeboard.trainer.plan.strategies, pipeboard.app.cli.plan; "
            "print('torch' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"
    code = ("import sys; from pipeboard.trainer.plan import plan; from pipeboard.trainer.profile.files import load_profile; "
            f"plan(load_profile({str(graph_txt('inception_v3'))!r}), [(4, 1e9), (4, 1e8)]); "
            "print('torch' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False True"
