"""From stage ranges to the flat pipeline: layers per stage, worker ranks, per-stage costs.

Worker ranks are numbered server by server: on ``[(4, 10e9), (4, 1.25e9)]`` the worker w of
server s has rank ``4 * s + w``. Each flat stage gets its costs from
``pipeboard.trainer.plan.formulas``.
"""

from __future__ import annotations

import heapq
import math

from pipeboard.trainer.plan.formulas import flat_allreduce_s, flat_stage_s, stage_memory_bytes, transfer_s
from pipeboard.trainer.plan.plan_format import Stage
from pipeboard.trainer.plan.states import StateChain, block


class Leaf:
    """A flat stage before it becomes a ``Stage``: its state range [start, end), its replicas
    and the index of its first machine within the enclosing block, per level (innermost first),
    and the 0-based level whose bandwidth the cut after it crosses (-1: the last stage)."""

    __slots__ = ("start", "end", "replicas", "first_machine", "cut_level")

    def __init__(self, start: int, end: int, replicas: list[int], first_machine: list[int], cut_level: int):
        self.start, self.end, self.replicas, self.first_machine, self.cut_level = (start, end, replicas,
                                                                                   first_machine, cut_level)

    def __repr__(self) -> str:
        return "Leaf(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


def worker_ranks(leaf: Leaf, levels: list[tuple[int, float]]) -> list[int]:
    ranks = [0]
    unit = 1
    for lvl, (workers, _) in enumerate(levels):
        offsets = [(leaf.first_machine[lvl] + a) * unit for a in range(leaf.replicas[lvl])]
        ranks = [r + o for o in offsets for r in ranks]
        unit *= workers
    return sorted(ranks)


def full_topological_order(n: int, succ: list[list[int]], pred: list[list[int]]) -> list[int]:
    """Every layer, smallest index first among those ready (file order where it can)."""
    indeg = [len(p) for p in pred]
    ready = [u for u in range(n) if indeg[u] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        u = heapq.heappop(ready)
        order.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(ready, v)
    return order


def layer_stages(chain: StateChain, bounds: list[tuple[int, int]], profile_edges, names: list[str]) -> list[list[str]]:
    """Layer names per stage, in topological order, including layers the states leave out.

    Inputs the reference removes go to the first stage; removed or unreached layers go with
    a consumer's stage when they have one, else with their producer's, else the last stage.
    """
    n = len(names)
    index = {name: i for i, name in enumerate(names)}
    stage_of = [-1] * n  # -1: not placed yet
    for s, (start, end) in enumerate(bounds):
        for u in chain.layers_between(start, end):
            if stage_of[u] < 0:
                stage_of[u] = s
    for u in chain.graph.removed_inputs:
        stage_of[u] = 0
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    in_file_order = True
    for a, b in profile_edges:
        ia, ib = index[a], index[b]
        succ[ia].append(ib)
        pred[ib].append(ia)
        in_file_order = in_file_order and ia < ib
    # The smallest-index-first topological order is file order itself when every edge runs forward.
    order = range(n) if in_file_order else full_topological_order(n, succ, pred)
    last = len(bounds) - 1
    for u in order:  # producers first, so a removed sink finds its producer placed
        if stage_of[u] >= 0:
            continue
        consumers = [stage_of[v] for v in succ[u] if stage_of[v] >= 0]
        producers = [stage_of[p] for p in pred[u] if stage_of[p] >= 0]
        stage_of[u] = min(consumers) if consumers else max(producers) if producers else last
    out: list[list[str]] = [[] for _ in bounds]
    for u in order:
        out[stage_of[u]].append(names[u])
    return out


def build_stages(chain: StateChain, leaves: list[Leaf], levels: list[tuple[int, float]], profile,
                 activation_compression: float | None) -> list[Stage]:
    """Flat stages with their costs under the planner's model (see docs/plan-format.md)."""
    names = profile.layer_names()
    layer_lists = layer_stages(chain, [(lf.start, lf.end) for lf in leaves], profile.edges, names)
    rank_lists = [worker_ranks(lf, levels) for lf in leaves]
    bandwidths = [bw for _, bw in levels]
    sends = [transfer_s(chain.output_activation[lf.end - 1], 1, levels[lf.cut_level][1], activation_compression)
             if lf.cut_level >= 0 and activation_compression is not None else 0.0 for lf in leaves]
    stages: list[Stage] = []
    for s, leaf in enumerate(leaves):
        i, j = leaf.start, leaf.end - 1
        compute, params, activation = (block(chain.compute_s, i, j), block(chain.parameters, i, j),
                                       block(chain.activation, i, j))
        replicas = math.prod(leaf.replicas)
        allreduce = flat_allreduce_s(params, leaf.replicas, bandwidths)
        later = sum(len(rank_lists[t]) for t in range(s, len(leaves)))
        in_flight = max(1, math.ceil(later / replicas))
        send_in = sends[s - 1] if s > 0 else 0.0
        stages.append(Stage(
            index=s,
            layers=layer_lists[s],
            replicas=replicas,
            workers=rank_lists[s],
            start_state=leaf.start,
            end_state=leaf.end,
            compute_s=compute,
            forward_s=block(chain.forward_s, i, j),
            backward_s=block(chain.backward_s, i, j),
            allreduce_s=allreduce,
            send_s=sends[s],
            activation_bytes_out=float(chain.output_activation[j]) if s < len(leaves) - 1 else 0.0,
            activation_bytes=activation,
            parameter_bytes=params,
            in_flight=in_flight,
            memory_bytes=stage_memory_bytes(params, activation, in_flight),
            time_s=flat_stage_s(compute, allreduce, replicas, send_in, sends[s]),
        ))
    return stages
