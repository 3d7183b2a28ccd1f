"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B with the backward split.

The backward is split into BI (gradient w.r.t. the stage input, which the previous stage waits
for) and W (gradient w.r.t. the weights, which nobody waits for). Forwards and BIs keep 1F1B's
order; a worker runs a pending W whenever its next F or BI still waits for data, which fills the
bubbles 1F1B leaves in its drain. To keep 1F1B's activation memory, a worker that already holds
NOAM_s = p - s microbatches (forward done, W not) runs a W before its next forward.

The order is decided once, on the nominal clock of ``placement`` (F = BI = W = 1), and then fixed:
the runtime and the simulator run the resulting action lists unchanged.
"""

from __future__ import annotations

from collections import deque

from trainer.schedule.actions import Action, Kind
from trainer.schedule.flush import one_f_one_b_order, update_ops
from trainer.schedule.placement import Ready
from trainer.schedule.topology import Topology


class ZeroBubblePolicy:
    def __init__(self, main: list[Action], tail: list[Action], cap: int) -> None:
        self.main = deque(main)  # F and BI in 1F1B order
        self.tail = deque(tail)  # all-reduce and step, after every W
        self.pending_w: deque[Action] = deque()
        self.in_flight = 0  # forwards whose W has not run
        self.cap = cap

    def choose(self, ready: Ready) -> Action | None:
        nxt = self.main[0] if self.main else None
        memory_full = nxt is not None and nxt.kind is Kind.FORWARD and self.in_flight >= self.cap
        if nxt is not None and ready(nxt) and not (memory_full and self.pending_w):
            self.main.popleft()
            if nxt.kind is Kind.FORWARD:
                self.in_flight += 1
            else:
                self.pending_w.append(Action(Kind.BACKWARD_WEIGHT, nxt.stage, nxt.microbatch, nxt.version))
            return nxt
        if self.pending_w:
            self.in_flight -= 1
            return self.pending_w.popleft()
        if nxt is None and self.tail:
            return self.tail.popleft()
        return None

    def finished(self) -> bool:
        return not (self.main or self.tail or self.pending_w)


def zero_bubble_policies(topo: Topology, m: int) -> list[ZeroBubblePolicy]:
    policies: list[ZeroBubblePolicy | None] = [None] * topo.num_workers
    for s in range(topo.num_stages):
        for rank in topo.group(s):
            main = [
                Action(Kind.FORWARD if kind is Kind.FORWARD else Kind.BACKWARD_INPUT, s, i, 0)
                for kind, i in one_f_one_b_order(topo.microbatches_of(rank, s, m), topo.noam(s))
            ]
            policies[rank] = ZeroBubblePolicy(main, update_ops(topo, s, 1), topo.noam(s))
    return policies  # type: ignore[return-value]
