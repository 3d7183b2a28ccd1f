"""Interleaved zero bubble (Qi et al., "Zero Bubble Pipeline Parallelism", 2023; its ZB-1P on
looped chunks): interleaved 1F1B with each backward split into input (BI) and weight (W)
gradients, the W put off to fill the waits.

Worker ``w`` of ``p`` holds stages ``w, w + p, ...`` (``v`` chunks). Microbatches go through the
chunks in rounds of ``r = m / max(1, m // p)`` (p when p divides m): the worker's k-th forward
runs chunk ``(k // r) mod v``, its k-th backward chunk ``v - 1 - (k // r) mod v``, each chunk
taking its microbatches in order. It warms up with ``(v - 1) r + p - 1 - w`` forwards, then
runs a forward (while any are left) and the next BI; from its ``w``-th backward on, each BI is
followed by the W of the backward ``w`` places before it, and the W left at the end close the
iteration. The lag ``w`` lets the W of the workers nearer the input wait for the gradients
coming back, which is where 1F1B idles. The order is torch's ``ScheduleInterleavedZeroBubble``'s
(tests compare them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeboard.trainer.schedule.actions import Action, Kind, ScheduleError
from pipeboard.trainer.schedule.registry import register

if TYPE_CHECKING:
    from pipeboard.trainer.schedule.registry import BuildContext


def interleaved_zb_order(p: int, v: int, w: int, m: int, stages: tuple[int, ...]) -> list[Action]:
    rounds = max(1, m // p)
    if m % rounds:
        raise ScheduleError(f"interleaved-zb runs microbatches in {rounds} rounds: {m} microbatches do not divide into them")
    r = m // rounds
    total = v * m
    warmup = min((v - 1) * r + p - 1 - w, total)
    forward_chunk = [stages[(k // r) % v] for k in range(total)]
    backward_chunk = [stages[v - 1 - (k // r) % v] for k in range(total)]
    counters: dict[tuple[Kind, int], int] = {}
    ops: list[Action] = []

    def emit(kind: Kind, stage: int) -> None:
        mb = counters.get((kind, stage), 0)
        counters[(kind, stage)] = mb + 1
        ops.append(Action(kind, stage, mb))

    for k in range(warmup):
        emit(Kind.FORWARD, forward_chunk[k])
    for j in range(total):
        if warmup + j < total:
            emit(Kind.FORWARD, forward_chunk[warmup + j])
        emit(Kind.BACKWARD_INPUT, backward_chunk[j])
        if j >= w:
            emit(Kind.BACKWARD_WEIGHT, backward_chunk[j - w])
    for j in range(max(0, total - w), total):
        emit(Kind.BACKWARD_WEIGHT, backward_chunk[j])
    return ops


def interleaved_zb_builder(ctx: BuildContext) -> list[list[Action]]:
    p, v = ctx.stages, ctx.chunks
    return [interleaved_zb_order(p, v, w.rank, ctx.microbatches, w.stages) + [Action(Kind.STEP, s, -1, 1) for s in w.stages]
            for w in ctx.topology.workers]


register("interleaved-zb", interleaved_zb_builder,
         description="Interleaved 1F1B with split backwards, each W put off to fill the waits (interleaved zero bubble).",
         replication=False, chunks=True, default_chunks=2, weight_grads=(), needs_split_backward=True)
