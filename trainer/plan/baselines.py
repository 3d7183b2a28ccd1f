"""Baseline partitioners in the Plan form, for comparison with PipeDream's DP.

All but ``dp`` are straight pipelines with one worker per stage (as torchgpipe and DeepSpeed
place one partition per device), cut between contiguous ranges of a topological order of the
layers (the linearised state chain: every tensor crossing a cut is sent):
- ``uniform``: the same number of layers per stage;
- ``time``: stages balanced by forward+backward time (the smallest possible slowest stage,
  as torchgpipe's ``balance_by_time`` aims for);
- ``params``: stages balanced by parameter bytes (DeepSpeed's ``partition_method='parameters'``);
- ``dp``: pure data parallelism, every worker holding the whole model.
Each is scored with the planner's cost model, so predicted throughputs compare like for like.
"""

from __future__ import annotations

import bisect
import math

from pipeboard.trainer.plan.cluster import total_workers
from pipeboard.trainer.plan.formulas import data_parallel_s
from pipeboard.trainer.plan.flat_stages import Leaf, build_stages
from pipeboard.trainer.plan.plan_format import Level, LevelStage, Plan, timing_fields
from pipeboard.trainer.plan.states import StateChain, state_chain
from pipeboard.trainer.profile.schema import Profile


def uniform_bounds(n: int, parts: int) -> list[int]:
    """Stage ends (exclusive) splitting n items into ``parts`` runs whose sizes differ by at most one."""
    base, extra = divmod(n, parts)
    ends, at = [], 0
    for p in range(parts):
        at += base + (1 if p < extra else 0)
        ends.append(at)
    return ends


def balanced_bounds(weights, parts: int) -> list[int]:
    """Stage ends of a contiguous split into ``parts`` non-empty runs minimising the largest sum."""
    n = len(weights)
    weights = [max(float(w), 0.0) for w in weights]
    cum = [0.0]
    for w in weights:
        cum.append(cum[-1] + w)

    def greedy(limit: float) -> list[int] | None:
        # Longest runs whose sum stays within limit; None if more than ``parts`` are needed.
        ends, start = [], 0
        while start < n:
            end = bisect.bisect_right(cum, cum[start] + limit) - 1
            end = max(end, start + 1)
            if cum[end] - cum[start] > limit:
                return None
            ends.append(end)
            start = end
            if len(ends) > parts:
                return None
        return ends

    lo, hi = max(weights, default=0.0), cum[-1]
    best = greedy(hi) or [n]
    for _ in range(100):
        if hi - lo <= 1e-12 * max(hi, 1e-300):
            break
        mid = (lo + hi) / 2
        found = greedy(mid)
        if found is None:
            lo = mid
        else:
            hi, best = mid, found
    # Fewer runs than parts: split the longest runs (never raises the largest sum).
    ends = list(best)
    while len(ends) < parts:
        starts = [0] + ends[:-1]
        sizes = [e - s for s, e in zip(starts, ends)]
        k = sizes.index(max(sizes))
        if sizes[k] < 2:
            break
        ends.insert(k, starts[k] + sizes[k] // 2)
    return ends


def _cut_level(rank: int, levels) -> int:
    """Index of the outermost level separating worker ``rank`` from ``rank + 1``."""
    unit, cut = 1, 0
    for idx, (workers, _) in enumerate(levels):
        if rank // unit != (rank + 1) // unit:
            cut = idx
        unit *= workers
    return cut


def _first_machines(rank: int, levels) -> list[int]:
    out, unit = [], 1
    for workers, _ in levels:
        out.append((rank // unit) % workers)
        unit *= workers
    return out


def baseline_plan(profile: Profile, levels, method: str, *, activation_compression=1.0,
                  chain: StateChain | None = None) -> Plan:
    chain = chain or state_chain(profile, linearise=True)
    n = chain.size
    W = total_workers(levels)
    single = chain.compute_s[-1]
    dp_time = data_parallel_s(single, chain.parameters[-1], levels)
    if method == "dp":
        leaves = [Leaf(0, n, [w for w, _ in levels], [0] * len(levels), -1)]
    else:
        parts = min(W, n)
        cum = chain.compute_s if method == "time" else chain.parameters
        per_state = [b - a for a, b in zip([0.0] + cum[:-1], cum)]
        ends = uniform_bounds(n, parts) if method == "uniform" else balanced_bounds(per_state, parts)
        starts = [0] + ends[:-1]
        leaves = [
            Leaf(s, e, [1] * len(levels), _first_machines(rank, levels), -1 if e == n else _cut_level(rank, levels))
            for rank, (s, e) in enumerate(zip(starts, ends))
        ]
    stages = build_stages(chain, leaves, levels, profile, activation_compression)
    best = dp_time if method == "dp" else max(st.time_s for st in stages)
    used = sum(st.replicas for st in stages)
    return Plan(
        method=method,
        model=profile.model,
        state_graph=chain.kind,
        states=n,
        cluster=list(levels),
        total_workers=W,
        workers_used=used,
        **timing_fields(best, single, dp_time),
        noam=math.ceil(used / stages[0].replicas),
        levels=[Level(1, W, levels[0][1], [LevelStage(st.start_state, st.end_state, st.replicas, st.compute_s, list(st.layers))
                                            for st in stages])],
        stages=stages,
        options={"activation_compression": activation_compression, "flat": True},
    )
