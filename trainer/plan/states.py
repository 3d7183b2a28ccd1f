"""State chains: what the planner's DP reads about a profile, per state.

Exact antichain states (the reference's, in its order) when they number at most a limit,
otherwise a linearised topological order in which every tensor crossing a cut is counted.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from trainer.graph import AntichainWalk, LayerGraph, StateLimitExceeded, _bits, _reverse_postorder
from trainer.plan.bitpairs import bit_rows, chain_pairs, pairs_of
from trainer.profile.schema import Profile


@dataclass
class StateChain:
    """What the planner's DP needs, per state in the reference's topological order.

    Cumulative quantities are sums over the state's down-set: ``compute_s`` (forward+backward,
    seconds), ``forward_s``, ``backward_s``, ``activation`` and ``parameters`` (bytes);
    ``output_activation`` is what crosses a cut right after the state. ``ancestor_bits[j]``
    has bit k set when state k precedes state j in the state DAG (a stage may run from k+1
    to j; None: a chain, every earlier state); ``pairs`` lists them as (k, j), grouped by j,
    k ascending, and ``ancestors`` as an (n, n) matrix.
    """

    kind: str  # "antichain" (exact) or "linearised" (topological order treated as a chain)
    downsets: list[int]
    frontiers: list[list[int]]
    compute_s: np.ndarray
    forward_s: np.ndarray
    backward_s: np.ndarray
    activation: np.ndarray
    parameters: np.ndarray
    output_activation: np.ndarray
    graph: LayerGraph
    ancestor_bits: list[int] | None = None  # per state, its ancestors as a bitset (None: a chain)

    @property
    def size(self) -> int:
        return len(self.downsets)

    @functools.cached_property
    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        return chain_pairs(self.size) if self.ancestor_bits is None else pairs_of(self.ancestor_bits)

    @property
    def ancestors(self) -> np.ndarray:
        """(n, n) bool: ``ancestors[j, k]`` says state k precedes state j."""
        out = np.zeros((self.size, self.size), dtype=bool)
        out[self.pairs[1], self.pairs[0]] = True
        return out

    def is_chain(self) -> bool:
        n = self.size
        return self.ancestor_bits is None or sum(map(int.bit_count, self.ancestor_bits)) == n * (n - 1) // 2

    def layers_between(self, start: int, end: int) -> list[int]:
        """Layers of states start..end-1 (half-open, as the reference prints stages), file order."""
        upper = self.downsets[end - 1]
        lower = self.downsets[start - 1] if start > 0 else 0
        return _bits(upper & ~lower)


def _chain_from(graph: LayerGraph, kind: str, downsets: list[int], frontiers: list[list[int]],
                out_act: np.ndarray, ancestor_bits: list[int] | None = None) -> StateChain:
    width = len(graph.names)
    member = bit_rows(downsets, width).astype(float)
    fwd = graph.forward_ms / 1000.0
    bwd = graph.backward_ms / 1000.0
    return StateChain(
        kind=kind,
        downsets=downsets,
        frontiers=frontiers,
        compute_s=member @ ((graph.forward_ms + graph.backward_ms) / 1000.0),
        forward_s=member @ fwd,
        backward_s=member @ bwd,
        activation=member @ graph.activation,
        parameters=member @ graph.parameters,
        output_activation=out_act,
        graph=graph,
        ancestor_bits=ancestor_bits,
    )


def antichain_states(graph: LayerGraph, max_states: int = 2000) -> StateChain:
    """The reference's antichain states; raises ``StateLimitExceeded`` past ``max_states``."""
    walk = AntichainWalk(graph, max_states)
    augmented, edges = walk.run()
    order = _reverse_postorder(edges)
    downsets = list(map(walk.downsets.__getitem__, order))
    frontiers = list(map(augmented.__getitem__, order))
    n = len(order)
    position = [0] * n
    for i, sid in enumerate(order):
        position[sid] = i
    # In topological order a state's ancestors are final before it passes them on.
    state_anc = [0] * n
    for i, sid in enumerate(order):
        mine = state_anc[i] | (1 << i)
        for t in edges[sid]:
            state_anc[position[t]] |= mine
    act = graph.activation.tolist()
    out_act = np.array([sum(map(act.__getitem__, f)) for f in frontiers], dtype=float)
    return _chain_from(graph, "antichain", downsets, frontiers, out_act, state_anc)


def linearised_states(graph: LayerGraph) -> StateChain:
    """A topological order as a chain: state k = the first k+1 layers; every crossing tensor counts."""
    order = graph.topological_order()
    n = len(order)
    pos = {u: i for i, u in enumerate(order)}
    # Layer u's output crosses every cut between u and its last consumer.
    delta = np.zeros(n + 1)
    for u in order:
        if graph.succ[u]:
            last = max(pos[v] for v in graph.succ[u])
            delta[pos[u]] += graph.activation[u]
            delta[last] -= graph.activation[u]
    out_act = np.cumsum(delta)[:n]
    downsets, frontiers = [], []
    down = 0
    for i, u in enumerate(order):
        down |= 1 << u
        downsets.append(down)
        frontiers.append([w for w in order[: i + 1] if graph.succ[w] and max(pos[v] for v in graph.succ[w]) > i]
                         if n <= 400 else [u])
    return _chain_from(graph, "linearised", downsets, frontiers, out_act)


def state_chain(profile: Profile, max_states: int = 2000, linearise: bool | None = None) -> StateChain:
    """Exact antichain states when they number at most ``max_states``, else a linearised order.

    ``linearise=True`` forces the linear order, ``False`` forces exact states (may raise
    ``StateLimitExceeded``), ``None`` chooses.
    """
    graph = LayerGraph.from_profile(profile)
    if linearise:
        return linearised_states(graph)
    try:
        chain = antichain_states(graph, max_states)
    except StateLimitExceeded:
        if linearise is False:
            raise
        return linearised_states(graph)
    if chain.downsets[-1] != graph.alive and linearise is None:
        # The reference walks from the first source only; with several sources (after its
        # Input removal) it would leave layers out of every stage's cost. Never on the shared
        # profiles; elsewhere, plan every layer on a linear order instead.
        return linearised_states(graph)
    return chain
