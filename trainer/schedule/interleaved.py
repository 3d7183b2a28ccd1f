"""Interleaved 1F1B (Megatron-LM): each of p workers holds v model chunks.

Worker ``w`` holds virtual stages ``w, w + p, ..., w + (v-1) p``. Microbatches go through the
chunks in groups of p: forward number k of a worker is chunk ``(k // p) % v`` of microbatch
``(k // (p v)) p + k % p``; backwards visit the chunks in reverse. Worker ``w`` warms up with
``2 (p - w - 1) + (v - 1) p`` forwards, then alternates forward and backward, then drains. The
bubble shrinks from (p-1)/(m+p-1) to (p-1)/(v m+p-1) at the price of v times more transfers.
Needs ``microbatches`` to be a multiple of p (Megatron's condition for this order).
With one chunk it is plain 1F1B.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeboard.trainer.schedule.actions import Action, Kind, ScheduleError
from pipeboard.trainer.schedule.flush import backward_ops, one_f_one_b_builder
from pipeboard.trainer.schedule.topology import Topology

if TYPE_CHECKING:
    from pipeboard.trainer.schedule.registry import BuildContext


def interleaved_builder(ctx: BuildContext) -> list[list[Action]]:
    """The registry's builder of ``interleaved-1f1b``."""
    if ctx.chunks == 1:
        return one_f_one_b_builder(ctx)
    return interleaved_programs(ctx.topology, ctx.stages, ctx.chunks, ctx.microbatches, ctx.split_backward)


def interleaved_programs(topo: Topology, p: int, v: int, m: int, split: bool) -> list[list[Action]]:
    if m % p:
        raise ScheduleError(f"microbatches ({m}) must be a multiple of stages ({p}) for interleaved-1f1b")
    total = m * v

    def microbatch(k: int) -> int:
        return (k // (p * v)) * p + k % p

    programs = []
    for w in range(p):

        def fwd(k: int) -> Action:
            return Action(Kind.FORWARD, ((k // p) % v) * p + w, microbatch(k), 0)

        def bwd(k: int) -> list[Action]:
            return backward_ops((v - 1 - (k // p) % v) * p + w, microbatch(k), 0, split)

        warmup = min(2 * (p - w - 1) + (v - 1) * p, total)
        ops = [fwd(k) for k in range(warmup)]
        for j in range(total - warmup):
            ops.append(fwd(warmup + j))
            ops += bwd(j)
        for j in range(total - warmup, total):
            ops += bwd(j)
        ops += [Action(Kind.STEP, s, -1, 1) for s in topo.workers[w].stages]
        programs.append(ops)
    return programs
