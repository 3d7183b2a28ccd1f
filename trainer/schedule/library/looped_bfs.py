"""Looped BFS (Lamy-Poirier, "Breadth-First Pipeline Parallelism", 2022): chunks placed in a loop,
each chunk running every microbatch before the next chunk starts.

Worker ``w`` of ``p`` holds stages ``w, w + p, ...``; it runs all ``m`` forwards of its first
chunk, then of its second, and so on, then the backwards chunk by chunk from its last, each
chunk's microbatches from the last to the first. Breadth first: a chunk's weights are used for
all microbatches at once (what makes sharding them cheap), at the price of keeping every
microbatch's activations of every chunk until the backwards. The order is torch's
``ScheduleLoopedBFS``'s (tests compare them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeboard.trainer.schedule.actions import Action, Kind
from pipeboard.trainer.schedule.flush import backward_ops
from pipeboard.trainer.schedule.registry import register

if TYPE_CHECKING:
    from pipeboard.trainer.schedule.registry import BuildContext


def looped_bfs_builder(ctx: BuildContext) -> list[list[Action]]:
    m = ctx.microbatches
    programs = []
    for w in ctx.topology.workers:
        ops = [Action(Kind.FORWARD, s, i) for s in w.stages for i in range(m)]
        for s in reversed(w.stages):
            for i in reversed(range(m)):
                ops += backward_ops(s, i, 0, ctx.split_backward)
        programs.append(ops + [Action(Kind.STEP, s, -1, 1) for s in w.stages])
    return programs


register("looped-bfs", looped_bfs_builder,
         description="Breadth-first chunks in a loop (looped BFS): each chunk runs every microbatch before the next.",
         replication=False, chunks=True, default_chunks=2)
