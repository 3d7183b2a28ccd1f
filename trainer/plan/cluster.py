"""The cluster a plan targets, and turning stage ranges into a flat pipeline on worker ranks.

A cluster is a list of levels, innermost first: ``[(4, 10e9), (4, 1.25e9)]`` is 4 servers of
4 workers, 10 GB/s inside a server and 1.25 GB/s between servers. Worker ranks are numbered
server by server: the worker w of server s at level 2 has rank ``s * 4 + w``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainer.plan.states import StateChain
from trainer.plan.errors import PlanError
from trainer.plan.model import Stage


def validate_levels(levels) -> list[tuple[int, float]]:
    """Check and normalise ``[(workers, bandwidth), ...]``; one clear PlanError per problem."""
    if levels is None or len(levels) == 0:
        raise PlanError("levels: give at least one (workers, bandwidth) level")
    out = []
    for idx, level in enumerate(levels, start=1):
        try:
            workers, bandwidth = level
        except (TypeError, ValueError):
            raise PlanError(f"levels[{idx}]: expected a (workers, bandwidth) pair, got {level!r}") from None
        whole = isinstance(workers, int) or (isinstance(workers, float) and workers.is_integer())
        if isinstance(workers, bool) or not whole:
            raise PlanError(f"workers (level {idx}): must be a whole number, got {workers!r}")
        workers = int(workers)
        if workers < 1:
            raise PlanError(f"workers (level {idx}): must be at least 1, got {workers}")
        try:
            bandwidth = float(bandwidth)
        except (TypeError, ValueError):
            raise PlanError(f"bandwidth (level {idx}): must be a number of bytes/s, got {bandwidth!r}") from None
        if not math.isfinite(bandwidth) or bandwidth <= 0:
            raise PlanError(f"bandwidth (level {idx}): must be positive bytes/s, got {bandwidth:g}")
        out.append((workers, bandwidth))
    return out


def levels_from_lists(workers: list[int], bandwidths: list[float]) -> list[tuple[int, float]]:
    """Pair ``--workers`` with ``--bandwidth`` values; their counts must match."""
    if len(workers) != len(bandwidths):
        raise PlanError(
            f"levels: --workers has {len(workers)} value(s) but --bandwidth has {len(bandwidths)}; "
            "give one bandwidth per level"
        )
    return validate_levels(list(zip(workers, bandwidths)))


def total_workers(levels: list[tuple[int, float]]) -> int:
    return math.prod(w for w, _ in levels)


def data_parallel_time(compute_s: float, parameter_bytes: float, levels: list[tuple[int, float]]) -> float:
    """Every worker holds the whole model; the reference's hierarchical all-reduce estimate."""
    time = compute_s
    below = 1
    for workers, bandwidth in levels:
        comm = ((4 * (workers - 1) * parameter_bytes) / (bandwidth * workers)) / below
        time = sum([time, comm]) / workers
        below = workers
    return time


@dataclass
class Leaf:
    """A flat stage before it becomes a ``Stage``: its state range and replicas per level."""

    start: int
    end: int
    replicas: list[int]  # per level, innermost first
    first_machine: list[int]  # per level, index of its first machine within the enclosing block
    cut_level: int  # 0-based level whose bandwidth the cut after this stage crosses (-1: last stage)


def worker_ranks(leaf: Leaf, levels: list[tuple[int, float]]) -> list[int]:
    ranks = [0]
    unit = 1
    for lvl, (workers, _) in enumerate(levels):
        offsets = [(leaf.first_machine[lvl] + a) * unit for a in range(leaf.replicas[lvl])]
        ranks = [r + o for o in offsets for r in ranks]
        unit *= workers
    return sorted(ranks)


def layer_stages(chain: StateChain, bounds: list[tuple[int, int]], profile_edges, names: list[str]) -> list[list[str]]:
    """Layer names per stage, in topological order, including layers the states leave out.

    Inputs the reference removes go to the first stage; removed or unreached layers go with
    a consumer's stage when they have one, else with their producer's, else the last stage.
    """
    g = chain.graph
    n = len(names)
    index = {name: i for i, name in enumerate(names)}
    stage_of = [-1] * n  # -1: not placed yet
    for s, (start, end) in enumerate(bounds):
        for u in chain.layers_between(start, end):
            if stage_of[u] < 0:
                stage_of[u] = s
    for u in g.removed_inputs:
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
    order = range(n) if in_file_order else _full_topological_order(n, succ, pred)
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


def _full_topological_order(n: int, succ: list[list[int]], pred: list[list[int]]) -> list[int]:
    """Every layer, smallest index first among those ready (file order where it can)."""
    import heapq

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


def build_stages(chain: StateChain, leaves: list[Leaf], levels: list[tuple[int, float]], profile,
                 activation_compression: float | None) -> list[Stage]:
    """Flat stages with their costs under the planner's model (see docs/plan-format.md)."""
    names = profile.layer_names()
    layer_lists = layer_stages(chain, [(lf.start, lf.end) for lf in leaves], profile.edges, names)
    rank_lists = [worker_ranks(lf, levels) for lf in leaves]
    stages: list[Stage] = []
    sends = []
    for leaf in leaves:
        out_bytes = float(chain.output_activation[leaf.end - 1]) if leaf.cut_level >= 0 else 0.0
        if leaf.cut_level >= 0 and activation_compression is not None:
            sends.append(2.0 * out_bytes / levels[leaf.cut_level][1] / activation_compression)
        else:
            sends.append(0.0)
    for s, leaf in enumerate(leaves):
        block = lambda arr: float(arr[leaf.end - 1] - (arr[leaf.start - 1] if leaf.start > 0 else 0.0))  # noqa: E731
        compute, params = block(chain.compute_s), block(chain.parameters)
        replicas = math.prod(leaf.replicas)
        # Ring all-reduce per level; above level 1 the stage's inner replicas share the traffic.
        allreduce, inner = 0.0, 1
        for r, (_, bw) in zip(leaf.replicas, levels):
            if r > 1:
                allreduce += 4 * (r - 1) * params / (bw * r) / inner
            inner *= r
        later = sum(len(rank_lists[t]) for t in range(s, len(leaves)))
        in_flight = max(1, math.ceil(later / replicas))
        activation = block(chain.activation)
        send_in = sends[s - 1] if s > 0 else 0.0
        stages.append(Stage(
            index=s,
            layers=layer_lists[s],
            replicas=replicas,
            workers=rank_lists[s],
            start_state=leaf.start,
            end_state=leaf.end,
            compute_s=compute,
            forward_s=block(chain.forward_s),
            backward_s=block(chain.backward_s),
            allreduce_s=allreduce,
            send_s=sends[s],
            activation_bytes_out=float(chain.output_activation[leaf.end - 1]) if s < len(leaves) - 1 else 0.0,
            activation_bytes=activation,
            parameter_bytes=params,
            in_flight=in_flight,
            memory_bytes=params + in_flight * activation,
            time_s=max((compute + allreduce) / replicas, send_in / replicas, sends[s] / replicas),
        ))
    return stages
