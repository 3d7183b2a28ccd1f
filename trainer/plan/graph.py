"""The layer DAG seen by the planner: antichain states and the cuts allowed between them.

PipeDream's optimizer never cuts a DAG arbitrarily: it walks a chain of *antichain states*.
A state is a set of layers no two of which depend on each other, "augmented" with the earlier
layers whose outputs are still needed later; the state's down-set (everything at or before it)
is what the first stages have computed when the pipeline is cut there. This module rebuilds
exactly the reference's states (msr-fiddle/pipedream, ``graph/graph.py``) in the reference's
order, because the planner's results at upper levels depend on that order.

When the states would explode (inception, NASNet: hundreds of thousands), the planner treats a
topological order of the layers as a chain instead (``pipeboard.trainer.plan.states``). No torch and no
NumPy here: the planner must start fast, and small plans never load NumPy at all.

Node sets are Python ints used as bitsets (bit i = layer i in file order): unions and
intersections of a few hundred layers are single machine operations.
"""

from __future__ import annotations

from pipeboard.trainer.profile.schema import Profile


class StateLimitExceeded(RuntimeError):
    """The antichain enumeration passed ``max_states``; the caller falls back to a linear order."""


def bit_indices(mask: int) -> list[int]:
    """Indices of the set bits of ``mask``, ascending."""
    if mask.bit_count() < 8:
        out = []
        while mask:
            low = mask & -mask
            out.append(low.bit_length() - 1)
            mask ^= low
        return out
    # Many bits: read them off the binary string (reversed, so index = bit), one comprehension
    # over the digits (a C-level scan per digit; no NumPy, which the planner loads only for
    # large problems).
    digits = bin(mask)[:1:-1]
    return [i for i, c in enumerate(digits) if c == "1"]


class LayerGraph:
    """The DAG the planner partitions, after the reference's clean-up.

    ``removed`` lists layers the reference takes out before planning (``Input*`` sources, which
    always go with the first stage, and unused ``__getitem__`` sinks, which go with their
    producer); ``alive`` is a bitset of the others. (A plain class: a dataclass would cost the
    planner's start a few milliseconds to build.)
    """

    def __init__(self, names: list[str], descs: list[str], forward_ms: list[float], backward_ms: list[float],
                 activation: list[float], parameters: list[float], succ: list[list[int]], pred: list[list[int]],
                 alive: int):
        self.names, self.descs = names, descs
        self.forward_ms, self.backward_ms = forward_ms, backward_ms
        self.activation, self.parameters = activation, parameters
        self.succ, self.pred, self.alive = succ, pred, alive
        self.removed_inputs: list[int] = []
        self.removed_sinks: list[int] = []
        self._anc: list[int] | None = None
        self._topo: list[int] | None = None

    @classmethod
    def from_profile(cls, profile: Profile) -> LayerGraph:
        names = profile.layer_names()
        index = {name: i for i, name in enumerate(names)}
        n = len(names)
        succ: list[list[int]] = [[] for _ in range(n)]
        pred: list[list[int]] = [[] for _ in range(n)]
        for src, dst in profile.edges:
            succ[index[src]].append(index[dst])
            pred[index[dst]].append(index[src])
        g = cls(
            names=names,
            descs=[layer.desc for layer in profile.layers],
            forward_ms=[float(layer.forward_ms) for layer in profile.layers],
            backward_ms=[float(layer.backward_ms) for layer in profile.layers],
            activation=[float(layer.activation_total) for layer in profile.layers],
            parameters=[float(layer.parameter_bytes) for layer in profile.layers],
            succ=succ,
            pred=pred,
            alive=(1 << n) - 1,
        )
        g._check_acyclic()
        g._drop_like_reference()
        return g

    def _check_acyclic(self) -> None:
        from pipeboard.trainer.plan.plan_error import PlanError

        indeg = [len(p) for p in self.pred]
        ready = [i for i, d in enumerate(indeg) if d == 0]
        seen = 0
        while ready:
            u = ready.pop()
            seen += 1
            for v in self.succ[u]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
        if seen != len(self.names):
            raise PlanError("profile: the layer graph has a cycle (edges must form a DAG)")

    def _remove(self, u: int) -> None:
        for v in self.succ[u]:
            self.pred[v].remove(u)
        for v in self.pred[u]:
            self.succ[v].remove(u)
        self.succ[u] = []
        self.pred[u] = []
        self.alive &= ~(1 << u)
        self._topo = self._anc = None

    def _drop_like_reference(self) -> None:
        # The reference gives the optimizer no say over where inputs go (always the first stage)
        # and drops unused tuple-indexing sinks; both change the states, so we do the same.
        for u in self.sources():
            if self.descs[u].startswith("Input"):
                self.removed_inputs.append(u)
        for u in self.removed_inputs:
            self._remove(u)
        for u in self.sinks():
            if self.descs[u].startswith("__getitem__"):
                self.removed_sinks.append(u)
        for u in self.removed_sinks:
            self._remove(u)

    def sources(self) -> list[int]:
        return [u for u in bit_indices(self.alive) if not self.pred[u]]

    def sinks(self) -> list[int]:
        return [u for u in bit_indices(self.alive) if not self.succ[u]]

    def topological_order(self) -> list[int]:
        """Alive layers in a topological order that keeps file order wherever it can."""
        if self._topo is not None:
            return list(self._topo)
        import heapq

        indeg = {u: len(self.pred[u]) for u in bit_indices(self.alive)}
        ready = [u for u, d in indeg.items() if d == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            u = heapq.heappop(ready)
            order.append(u)
            for v in self.succ[u]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    heapq.heappush(ready, v)
        self._topo = order
        return list(order)

    def ancestors(self) -> list[int]:
        """Per layer, the bitset of its strict ancestors."""
        if self._anc is None:
            anc = [0] * len(self.names)
            for u in self.topological_order():
                acc = 0
                for p in self.pred[u]:
                    acc |= anc[p] | (1 << p)
                anc[u] = acc
            self._anc = anc
        return self._anc


class AntichainWalk:
    """Enumerates the reference's antichain DAG, with the reference's caching and visit order.

    The reference caches augmented antichains, de-augmented ones and successor lists by the
    *set* of nodes, returning the list order of the first call; that order decides the order
    of edges and hence the topological order of states, so it is reproduced here. Where the
    reference iterates a Python set of node names (the "extra" nodes of an augmented antichain,
    whose order varies with the hash seed), we take file order.
    """

    def __init__(self, graph: LayerGraph, max_states: int):
        self.g = graph
        self.anc = graph.ancestors()
        self.max_states = max_states
        # needed[u]: the ancestors of u with a consumer outside u's down-set (they stay in any
        # augmented set holding u): the producers of the down-set's open edges' ends. reach[u]
        # is every consumer of a layer at or before u; pred_mask[s] the producers of s.
        succ, pred, anc = graph.succ, graph.pred, self.anc
        count = len(graph.names)
        self.bits = bits = [1 << u for u in range(count)]
        pred_of_bit: dict[int, int] = {}  # a layer's bit -> the bitset of its producers
        reach = [0] * count
        self.needed = needed = [0] * count
        order = graph.topological_order()
        for u in order:
            mask = 0
            for v in succ[u]:
                mask |= bits[v]
            producers = 0
            for q in pred[u]:
                mask |= reach[q]
                producers |= bits[q]
            reach[u] = mask
            pred_of_bit[bits[u]] = producers
        for u in order:
            before = anc[u]
            found = 0
            open_ends = reach[u] & ~(before | bits[u])
            while open_ends:  # (a few bits: lowest first, without listing them)
                low = open_ends & -open_ends
                found |= pred_of_bit[low]
                open_ends ^= low
            needed[u] = found & before

    def augment(self, antichain: list[int]) -> tuple[list[int], int]:
        """The antichain with the earlier nodes whose outputs are still needed in front, and
        the bitset of both."""
        extra = 0
        key = 0
        needed = self.needed
        for a in antichain:
            extra |= needed[a]
            key |= 1 << a
        return bit_indices(extra) + list(antichain), extra | key

    def run(self) -> tuple[list[list[int]], list[list[int]]]:
        """Return (augmented antichain per state id, out-edges per state id), ids by discovery;
        ``self.downsets`` then holds each state's down-set (bitset), and ``self.parents`` the
        state each was first found from (-1 for the first), by the same ids.

        The reference moves one node x of a state's augmented set to each successor of x (not
        already in the antichain, and not an ancestor of a node still in the set), then
        de-augments: it keeps the nodes of the new set that are no ancestor of another one,
        in the set's list order, x's place taken by its successor. That kept set is the new
        state's key; here it is one bit expression, with the ancestors' union of the set
        without x precomputed per x. The list order only matters when a state is first
        found (the reference's caches, keyed by node set, return the first call's order ever
        after), so the list is built then only. The reference queues a state once per edge
        into it and skips it when dequeued again; queueing it only when first found expands
        the states in the same order.

        The new key is the set of maximal nodes of (the set without x) plus the successor, so
        its down-set is the old state's down-set plus the successor's: one union per state.
        """
        anc, succ, needed, bits = self.anc, self.g.succ, self.needed, self.bits
        # Per node x, each successor with what a step to it reads (its bit, its strict
        # ancestors, and its down-set), so the inner loop indexes nothing.
        steps = [[(v, bits[v], anc[v], anc[v] | bits[v]) for v in succ[x]] for x in range(len(anc))]
        source = self.g.sources()[0]
        start_key = bits[source]
        ids = {start_key: 0}
        first, first_members = self.augment([source])
        augmented, members_of, keys = [first], [first_members], [start_key]
        downsets = [anc[source] | start_key]
        edges: list[list[int]] = [[]]
        parents = [-1]
        # (a method, not a closure: a closure would turn these locals into cells, which slows
        # every access to them in the loop below)
        add_state = _NewStates(ids, augmented, members_of, keys, downsets, edges, parents, self.max_states).add
        sid = 0
        while sid < len(augmented):
            aug, out, down = augmented[sid], edges[sid], downsets[sid]
            if len(aug) == 1:
                # A lone node (nothing else in the set): every successor is a step, and the new
                # key is the successor alone (the set without x is empty).
                x = aug[0]
                for nxt, bit, _, nxt_down in steps[x]:
                    nid = ids.get(bit)
                    if nid is None:
                        nid = add_state(bit, needed[nxt], [nxt], down | nxt_down, sid)
                    out.append(nid)
                sid += 1
                continue
            key, members, parent = keys[sid], members_of[sid], sid
            sid += 1
            # Each node x of the set with the ancestors of the set's other nodes.
            if len(aug) == 2:  # (the commonest set: one node and one still needed, or two branches)
                a0, a1 = aug
                anc0, anc1 = anc[a0], anc[a1]
                moves = ((a0, anc1), (a1, anc0))
                below_all = anc0 | anc1
            else:
                size = len(aug)
                suffix = [0] * (size + 1)  # suffix[p]: ancestors of aug[p:]
                for p in range(size - 1, -1, -1):
                    suffix[p] = suffix[p + 1] | anc[aug[p]]
                moves = []
                prefix = 0
                for p in range(size):
                    moves.append((aug[p], prefix | suffix[p + 1]))
                    prefix |= anc[aug[p]]
                below_all = suffix[0]
            # A successor in the antichain, or an ancestor of a node of the set (the set then
            # holds one of its descendants: stepping there would skip over that node), is no step.
            blocked = key | below_all
            for x, below_others in moves:
                others = members ^ bits[x]  # (x is in the set)
                for nxt, bit, nxt_anc, nxt_down in steps[x]:
                    if blocked & bit:
                        continue
                    new_key = (others | bit) & ~(below_others | nxt_anc)
                    nid = ids.get(new_key)
                    if nid is None:
                        extra = 0
                        front = []
                        for y in aug:
                            u = nxt if y == x else y
                            if new_key & bits[u]:
                                front.append(u)
                                extra |= needed[u]
                        nid = add_state(new_key, extra, front, down | nxt_down, parent)
                    out.append(nid)
        self.downsets = downsets
        self.parents = parents
        return augmented, edges


class _NewStates:
    """Registers a newly found state in the walk's lists (once per state, not per edge)."""

    __slots__ = ("ids", "augmented", "members_of", "keys", "downsets", "edges", "parents", "extras_of", "max_states")

    def __init__(self, ids, augmented, members_of, keys, downsets, edges, parents, max_states) -> None:
        self.ids, self.augmented, self.members_of, self.keys = ids, augmented, members_of, keys
        self.downsets, self.edges, self.parents, self.max_states = downsets, edges, parents, max_states
        self.extras_of: dict[int, list[int]] = {0: []}  # the needed extras' bits, ascending, by bitset

    def add(self, key: int, extra: int, front: list[int], down_set: int, parent: int) -> int:
        """The new state's id; its augmented list is the needed extras ascending, then ``front``
        (the kept nodes in the reference's order). ``parent``: the state it was found from."""
        augmented = self.augmented
        nid = len(augmented)
        if nid >= self.max_states:
            raise StateLimitExceeded(f"more than {self.max_states} antichain states")
        self.ids[key] = nid
        head = self.extras_of.get(extra)
        if head is None:
            head = self.extras_of[extra] = bit_indices(extra)
        augmented.append(head + front)
        self.members_of.append(extra | key)
        self.keys.append(key)
        self.downsets.append(down_set)
        self.edges.append([])
        self.parents.append(parent)
        return nid


def reverse_postorder(edges: list[list[int]], root: int = 0) -> list[int]:
    """Depth-first from ``root``, children in edge order; the reference's topological sort."""
    done = [False] * len(edges)
    order: list[int] = []
    done[root] = True
    nodes, children = [root], [iter(edges[root])]  # the path from the root, and where each stands
    while children:
        for child in children[-1]:
            if not done[child]:
                done[child] = True
                nodes.append(child)
                children.append(iter(edges[child]))
                break
        else:
            children.pop()
            order.append(nodes.pop())
    order.reverse()
    return order
