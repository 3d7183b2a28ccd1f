"""Compute orders of the synchronous schedules with a flush: GPipe, 1F1B (PipeDream-Flush) and DP.

Each worker runs its own microbatches (round robin over a stage's replicas), then the replicas of
a stage all-reduce their gradients and every worker takes one optimizer step. All forwards and
backwards use weight version 0; the step produces version 1.

``batch_weight_grads`` rewrites any program (these, interleaved, pipedream) so that each backward
computes input gradients only (BI) and one ``W(-1)`` computes the weight gradients of all of them
at once, right before the stage's update.

``gpipe_builder`` and ``one_f_one_b_builder`` are the registry's builders (registry.py) of
``gpipe``, ``1f1b`` and ``dp`` (1F1B on one replicated stage).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeboard.trainer.schedule.actions import Action, Kind
from pipeboard.trainer.schedule.topology import Topology

if TYPE_CHECKING:
    from pipeboard.trainer.schedule.registry import BuildContext


# Looking a member up on an Enum class is a Python-level call (a quarter of a microsecond); the
# builders that run once per microbatch and stage use these names.
_BACKWARD, _BACKWARD_INPUT, _BACKWARD_WEIGHT = Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT


def backward_ops(stage: int, mb: int, version: int, split: bool) -> list[Action]:
    """A full backward, or its input half followed at once by its weight half."""
    if split:
        return [Action(_BACKWARD_INPUT, stage, mb, version), Action(_BACKWARD_WEIGHT, stage, mb, version)]
    return [Action(_BACKWARD, stage, mb, version)]


def update_ops(topo: Topology, stage: int, version: int) -> list[Action]:
    """All-reduce among the stage's replicas (if any), then the step producing ``version``."""
    ops = []
    if topo.replicas(stage) > 1:
        ops.append(Action(Kind.ALLREDUCE, stage, -1, version - 1, group=topo.group(stage)))
    ops.append(Action(Kind.STEP, stage, -1, version))
    return ops


def gpipe_ops(topo: Topology, rank: int, stage: int, m: int, split: bool) -> list[Action]:
    mbs = topo.microbatches_of(rank, stage, m)
    ops = [Action(Kind.FORWARD, stage, i, 0) for i in mbs]
    for i in mbs:
        ops += backward_ops(stage, i, 0, split)
    return ops + update_ops(topo, stage, 1)


def one_f_one_b_order(mbs: list[int], warmup: int) -> list[tuple[Kind, int]]:
    """``warmup`` forwards, then alternate one backward and one forward, then drain backwards."""
    forward, backward = Kind.FORWARD, Kind.BACKWARD
    k = min(warmup, len(mbs))
    order = [(forward, i) for i in mbs[:k]]
    for j, i in enumerate(mbs):
        order.append((backward, i))
        if k + j < len(mbs):
            order.append((forward, mbs[k + j]))
    return order


def one_f_one_b_ops(topo: Topology, rank: int, stage: int, m: int, split: bool) -> list[Action]:
    mbs = topo.microbatches_of(rank, stage, m)
    forward = Kind.FORWARD
    ops: list[Action] = []
    for kind, i in one_f_one_b_order(mbs, topo.noam(stage)):
        if kind is forward:
            ops.append(Action(forward, stage, i, 0))
        else:
            ops += backward_ops(stage, i, 0, split)
    return ops + update_ops(topo, stage, 1)


def gpipe_builder(ctx: BuildContext) -> list[list[Action]]:
    t = ctx.topology
    return [gpipe_ops(t, w.rank, w.stages[0], ctx.microbatches, ctx.split_backward) for w in t.workers]


def one_f_one_b_builder(ctx: BuildContext) -> list[list[Action]]:
    t = ctx.topology
    return [one_f_one_b_ops(t, w.rank, w.stages[0], ctx.microbatches, ctx.split_backward) for w in t.workers]


def batch_weight_grads(program: list[Action]) -> list[Action]:
    """Every B becomes BI; right before each update (ALLREDUCE, else STEP) of a stage with BIs
    since its last update, one ``W(-1)``: the weight gradients of all those microbatches. It names
    the version the stage holds then (the one the update replaces). BIs left at the end of the
    program (a program without a final update) get their ``W(-1)`` there."""
    backward, backward_input, weight = _BACKWARD, _BACKWARD_INPUT, _BACKWARD_WEIGHT
    allreduce, step = Kind.ALLREDUCE, Kind.STEP
    out: list[Action] = []
    pending: set[int] = set()
    held: dict[int, int] = {}
    for a in program:
        kind = a.kind
        if kind is backward:
            out.append(Action(backward_input, a.stage, a.microbatch, a.version))
            pending.add(a.stage)
            continue
        if (kind is allreduce or kind is step) and a.stage in pending:
            pending.discard(a.stage)
            out.append(Action(weight, a.stage, -1, held.get(a.stage, 0)))
        if kind is step:
            held[a.stage] = a.version
        out.append(a)
    for stage in sorted(pending):
        out.append(Action(weight, stage, -1, held.get(stage, 0)))
    return out
