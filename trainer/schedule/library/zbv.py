"""ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", 2023, section 6): two chunks per worker
placed in a V, backwards split into input (BI) and weight (W) gradients.

Worker ``w`` of ``p`` holds stage ``w`` on the way down and stage ``2p - 1 - w`` on the way back
up, so worker 0 computes both the first stage and the loss. Its order, with ``n = max(m, 2p - 1)``
slots per chunk (slots past the last microbatch are dropped, so a short iteration keeps the
shape):

1. ``2(p - w) - 1`` forwards of the down chunk;
2. ``w`` times: up forward, down forward;
3. ``p - w`` times: up forward, its BI and its W;
4. steady state, until both chunks have run ``n`` forwards: a down forward (while any are left),
   the oldest down BI and its W, an up forward, the oldest up BI and its W;
5. drain: ``w`` times a down BI and an up BI (their W put off), ``p - w`` times a down BI and the
   oldest pending down W, then every pending up W, then every pending down W.

With equal F, BI and W times the only idle time left is the fill, so the bubble nearly vanishes
once ``m >= 2p``. The order is torch's ``ScheduleZBVZeroBubble``'s (tests compare them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeboard.trainer.schedule.actions import Action, Kind, ScheduleError
from pipeboard.trainer.schedule.registry import register

if TYPE_CHECKING:
    from pipeboard.trainer.schedule.registry import BuildContext

F, BI, W = Kind.FORWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT


def zbv_order(p: int, w: int, m: int, down: int, up: int) -> list[Action]:
    """Worker ``w``'s computes (no updates), chunk ``down`` and ``up`` being its two stages."""
    n = max(m, 2 * p - 1)
    nxt = {(k, s): 0 for k in (F, BI, W) for s in (down, up)}  # the next microbatch of each kind and chunk
    ops: list[Action] = []

    def emit(kind: Kind, stage: int) -> None:
        ops.append(Action(kind, stage, nxt[(kind, stage)]))
        nxt[(kind, stage)] += 1

    def backward(stage: int) -> None:  # a BI and, at once, its W
        emit(BI, stage)
        emit(W, stage)

    for _ in range(2 * (p - w) - 1):
        emit(F, down)
    for _ in range(w):
        emit(F, up)
        emit(F, down)
    for _ in range(p - w):
        emit(F, up)
        backward(up)
    while nxt[(F, up)] < nxt[(F, down)] or nxt[(F, down)] < n:
        if nxt[(F, down)] < n:
            emit(F, down)
        backward(down)
        emit(F, up)
        backward(up)
    for _ in range(w):
        emit(BI, down)
        emit(BI, up)
    for _ in range(p - w):
        emit(BI, down)
        emit(W, down)
    for stage in (up, down):
        while nxt[(W, stage)] < nxt[(BI, stage)]:
            emit(W, stage)
    return [a for a in ops if a.microbatch < m]


def zbv_builder(ctx: BuildContext) -> list[list[Action]]:
    if ctx.chunks != 2:
        raise ScheduleError(f"zbv places exactly two chunks per worker in a V, got chunks={ctx.chunks}")
    p = ctx.stages
    return [zbv_order(p, w.rank, ctx.microbatches, *w.stages) + [Action(Kind.STEP, s, -1, 1) for s in w.stages]
            for w in ctx.topology.workers]


register("zbv", zbv_builder,
         description="Zero bubble in a V (ZB-V): two chunks per worker, down and back up, W filling the gaps.",
         replication=False, chunks=True, default_chunks=2, placement="v", weight_grads=(), needs_split_backward=True)
