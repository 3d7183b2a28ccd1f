"""State chains: what the planner's recurrence reads about a profile, per state.

Exact antichain states (the reference's, in its order) when they number at most a limit,
otherwise a linearised topological order in which every tensor crossing a cut is counted.
Plain Python lists throughout: a small plan is solved without ever loading NumPy, and the
vectorised strategies take arrays of these (``pipeboard.trainer.plan.strategies.arrays``) when they need them.
"""

from __future__ import annotations

from pipeboard.trainer.plan.graph import AntichainWalk, LayerGraph, StateLimitExceeded, bit_indices, reverse_postorder
from pipeboard.trainer.profile.schema import Profile


class StateChain:
    """Per state, in the reference's topological order, what the cost model needs.

    Cumulative quantities are sums over the state's down-set: ``compute_s`` (forward+backward,
    seconds), ``forward_s``, ``backward_s``, ``activation`` and ``parameters`` (bytes).
    ``output_activation[j]`` is what crosses a cut right after state j, ``sent_after[j]`` what a
    stage ending there sends on (nothing after the last state). ``ancestor_bits[j]`` has bit k
    set when state k precedes state j in the state DAG, so that a stage may run from k+1 to j
    (None: a chain, every earlier state precedes).
    """

    def __init__(self, kind: str, graph: LayerGraph, downsets: list[int], frontiers: list[list[int]],
                 sums: list[list[float]], output_activation: list[float], ancestor_bits: list[int] | None):
        self.kind = kind  # "antichain" (exact) or "linearised" (topological order treated as a chain)
        self.graph = graph
        self.downsets = downsets
        self.frontiers = frontiers
        self.compute_s, self.forward_s, self.backward_s, self.activation, self.parameters = sums
        self.output_activation = output_activation
        self.sent_after = output_activation[:-1] + [0.0]
        self.ancestor_bits = ancestor_bits

    @property
    def size(self) -> int:
        return len(self.downsets)

    def predecessors(self, j: int) -> list[int]:
        """The states k that precede state j, ascending: a last stage k+1..j may follow them."""
        return list(range(j)) if self.ancestor_bits is None else bit_indices(self.ancestor_bits[j])

    def pair_count(self) -> int:
        """How many (k, j) pairs of preceding states there are (the edges the recurrence reads)."""
        n = self.size
        return n * (n - 1) // 2 if self.ancestor_bits is None else sum(map(int.bit_count, self.ancestor_bits))

    def is_chain(self) -> bool:
        """Every state precedes every later one (a chain of layers, or a linearised order)."""
        n = self.size
        return self.ancestor_bits is None or self.pair_count() == n * (n - 1) // 2

    def layers_between(self, start: int, end: int) -> list[int]:
        """Layers of states start..end-1 (half-open, as the reference prints stages), file order."""
        upper = self.downsets[end - 1]
        lower = self.downsets[start - 1] if start > 0 else 0
        return bit_indices(upper & ~lower)


def block(cumulative: list[float], i: int, j: int) -> float:
    """``cumulative`` summed over states i..j as the reference forms it: a difference of sums."""
    return cumulative[j] - cumulative[i - 1] if i > 0 else cumulative[j]


def _per_layer(graph: LayerGraph) -> list[list[float]]:
    fwd = [f / 1000.0 for f in graph.forward_ms]
    bwd = [b / 1000.0 for b in graph.backward_ms]
    compute = [(f + b) / 1000.0 for f, b in zip(graph.forward_ms, graph.backward_ms)]
    return [compute, fwd, bwd, graph.activation, graph.parameters]


def antichain_states(graph: LayerGraph, max_states: int = 2000) -> StateChain:
    """The reference's antichain states; raises ``StateLimitExceeded`` past ``max_states``."""
    walk = AntichainWalk(graph, max_states)
    augmented, edges = walk.run()
    order = reverse_postorder(edges)
    downsets_by_id = walk.downsets
    # Each state's sums are its parent's plus the layers its step adds (a few, not the down-set).
    per_layer = _per_layer(graph)
    by_id = [[sum(values[u] for u in bit_indices(downsets_by_id[0]))] for values in per_layer]
    for sid in range(1, len(downsets_by_id)):
        parent = walk.parents[sid]
        added = bit_indices(downsets_by_id[sid] & ~downsets_by_id[parent])
        for values, sums in zip(per_layer, by_id):
            total = sums[parent]
            for u in added:
                total += values[u]
            sums.append(total)
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
    frontiers = [augmented[sid] for sid in order]
    act = graph.activation
    out_act = [float(sum(act[u] for u in f)) for f in frontiers]
    sums = [[sums_by_id[sid] for sid in order] for sums_by_id in by_id]
    return StateChain("antichain", graph, [downsets_by_id[sid] for sid in order], frontiers, sums, out_act, state_anc)


def linearised_states(graph: LayerGraph) -> StateChain:
    """A topological order as a chain: state k = the first k+1 layers; every crossing tensor counts."""
    order = graph.topological_order()
    n = len(order)
    pos = {u: i for i, u in enumerate(order)}
    # Layer u's output crosses every cut between u and its last consumer.
    last_use = {u: max(pos[v] for v in graph.succ[u]) for u in order if graph.succ[u]}
    delta = [0.0] * (n + 1)
    for u, last in last_use.items():
        delta[pos[u]] += graph.activation[u]
        delta[last] -= graph.activation[u]
    out_act, running = [], 0.0
    for i in range(n):
        running += delta[i]
        out_act.append(running)
    downsets, frontiers, down = [], [], 0
    for i, u in enumerate(order):
        down |= 1 << u
        downsets.append(down)
        frontiers.append([w for w in order[: i + 1] if last_use.get(w, -1) > i] if n <= 400 else [u])
    sums = []
    for values in _per_layer(graph):
        cum, total = [], 0.0
        for u in order:
            total += values[u]
            cum.append(total)
        sums.append(cum)
    return StateChain("linearised", graph, downsets, frontiers, sums, out_act, None)


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
