"""DualPipeV (DeepSeek-V3's DualPipe folded onto half the workers, as torch's
``ScheduleDualPipeV``): two chunks per worker placed in a V, the steady state made of
overlapped pairs, one chunk's forward beside the other chunk's backward (actions.OverlapFB).

Worker ``w`` of ``p`` holds stage ``w`` (down) and ``2p - 1 - w`` (up); it needs ``m >= 2p``
microbatches. Each chunk takes its microbatches in order; a full backward (B) counts as its BI
and its W, and each BI queues its W, run later where the order says "a queued W". The phases:

1. ``2(p - w - 1)`` down forwards;
2. ``w + 1`` times: a down forward, an up forward;
3. ``p - w - 1`` times: an up BI, a queued W, an up forward (zero bubble);
4. ``m - 2p + w + 1`` times: the pair (down forward; up B), then the pair (up forward; down B);
   on the last worker the first of these runs as a forward then a backward, not overlapped;
5. ``p - w - 1`` times: an up B, the pair (up forward; down B);
6. ``w + 1`` times: an up backward, a down backward, full until half way, split (BI) after:
   an odd worker splits from the up backward of the middle round on, an even one from its down
   backward;
7. ``p - w - 1`` times: a queued W, a down backward (split if step 6 split);
8. ``w + 1`` queued W.

The pairs are where DualPipe hides one chunk's transfers behind the other's compute on a GPU;
pipeboard's runtime runs each pair's halves in sequence (see actions.OverlapFB for how the
simulator times them). The order is torch's (tests compare them).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from pipeboard.trainer.schedule.actions import Action, Kind, OverlapFB, ScheduleError
from pipeboard.trainer.schedule.registry import register

if TYPE_CHECKING:
    from pipeboard.trainer.schedule.registry import BuildContext

F, B, BI, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT


def dualpipev_order(p: int, w: int, m: int, down: int, up: int) -> list[Action | OverlapFB]:
    forwards = {down: 0, up: 0}
    backwards = {down: 0, up: 0}  # a B and a BI share the count: both compute the input gradient
    queued: deque[Action] = deque()  # the W of each BI, oldest first
    ops: list[Action | OverlapFB] = []

    def forward(stage: int) -> Action:
        forwards[stage] += 1
        return Action(F, stage, forwards[stage] - 1)

    def backward(stage: int, split: bool = False) -> Action:
        backwards[stage] += 1
        mb = backwards[stage] - 1
        if split:
            queued.append(Action(W, stage, mb))
        return Action(BI if split else B, stage, mb)

    def queued_weight() -> None:
        if queued:
            ops.append(queued.popleft())

    def pair(f_stage: int, b_stage: int) -> None:
        ops.append(OverlapFB(forward(f_stage), backward(b_stage)))

    ops += [forward(down) for _ in range(2 * (p - w - 1))]
    for _ in range(w + 1):
        ops += [forward(down), forward(up)]
    for _ in range(p - w - 1):
        ops.append(backward(up, split=True))
        queued_weight()
        ops.append(forward(up))
    for i in range(m - 2 * p + w + 1):
        if i == 0 and w == p - 1:
            ops += [forward(down), backward(up)]
        else:
            pair(down, up)
        pair(up, down)
    for _ in range(p - w - 1):
        ops.append(backward(up))
        pair(up, down)
    split = False
    for i in range(w + 1):
        middle = i == (w + 1) // 2
        split = split or (middle and w % 2 == 1)
        ops.append(backward(up, split))
        split = split or (middle and w % 2 == 0)
        ops.append(backward(down, split))
    for _ in range(p - w - 1):
        queued_weight()
        ops.append(backward(down, split))
    for _ in range(w + 1):
        queued_weight()
    return ops


def dualpipev_builder(ctx: BuildContext) -> list[list[Action | OverlapFB]]:
    p, m = ctx.stages, ctx.microbatches
    if ctx.chunks != 2:
        raise ScheduleError(f"dualpipev places exactly two chunks per worker in a V, got chunks={ctx.chunks}")
    if m < 2 * p:
        raise ScheduleError(f"dualpipev needs at least as many microbatches as stages ({2 * p}), got {m}")
    return [dualpipev_order(p, w.rank, m, *w.stages) + [Action(Kind.STEP, s, -1, 1) for s in w.stages]
            for w in ctx.topology.workers]


register("dualpipev", dualpipev_builder,
         description="DualPipeV: two chunks per worker in a V, one chunk's forward paired with the other's backward.",
         replication=False, chunks=True, default_chunks=2, placement="v", weight_grads=())
