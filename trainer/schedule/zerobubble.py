"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B with the backward split.

The backward is split into BI (gradient w.r.t. the stage input, which the previous stage waits
for) and W (gradient w.r.t. the weights, which nobody waits for). Forwards and BIs keep 1F1B's
order, and each W is put off so that it fills the waits 1F1B has in its drain. In the steady
state stage s of p runs the triple (F x, BI x-(p-1-s), W x-(p-1)): every stage finishes the W
of a microbatch p - 1 rounds after its forward. So every stage keeps at most p microbatches
between F and W, the same peak as 1F1B's stage 0, and with F = BI = W the bubble is one third
of 1F1B's: (p-1)(F+BI-W) instead of (p-1)(F+BI+W).

With replicated stages the same lags are counted in each replica's own microbatches: the BI
lag is NOAM_s - 1 and the W lag the largest NOAM over the stages, minus one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeboard.trainer.schedule.actions import Action, Kind
from pipeboard.trainer.schedule.flush import update_ops
from pipeboard.trainer.schedule.topology import Topology

if TYPE_CHECKING:
    from pipeboard.trainer.schedule.registry import BuildContext


def zero_bubble_builder(ctx: BuildContext) -> list[list[Action]]:
    """The registry's builder of ``zb-h1`` (its backwards are always split: ``ctx.split_backward``)."""
    t = ctx.topology
    return [zero_bubble_ops(t, w.rank, w.stages[0], ctx.microbatches) for w in t.workers]


def zero_bubble_ops(topo: Topology, rank: int, stage: int, m: int) -> list[Action]:
    mbs = topo.microbatches_of(rank, stage, m)
    b_lag = topo.noam(stage) - 1
    w_lag = max(max(topo.noam(s) for s in range(topo.num_stages)) - 1, b_lag)
    n = len(mbs)
    ops: list[Action] = []
    for x in range(n + w_lag):
        if x < n:
            ops.append(Action(Kind.FORWARD, stage, mbs[x], 0))
        if 0 <= x - b_lag < n:
            ops.append(Action(Kind.BACKWARD_INPUT, stage, mbs[x - b_lag], 0))
        if 0 <= x - w_lag < n:
            ops.append(Action(Kind.BACKWARD_WEIGHT, stage, mbs[x - w_lag], 0))
    return ops + update_ops(topo, stage, 1)
