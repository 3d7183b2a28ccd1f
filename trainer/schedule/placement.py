"""Turn per-worker compute orders into full action lists with explicit sends and receives.

A builder decides only the order of computation on each worker (F, B or BI/W, ALLREDUCE, STEP),
through a ``Policy``. This module runs that order once on a nominal clock (F = 1, B = 2, BI = W = 1,
communication free; a worker waits only for data it needs) and writes every action into its
worker's list at the moment it happens on that clock:

- a compute or collective is written when it finishes;
- a transfer is written, on both the sender (SEND) and the receiver (RECV), when the producing
  compute finishes. The receiver is usually busy with some compute at that moment, which it
  writes only later, so the RECV lands *before* the compute during which the data arrives: a
  runtime that posts receives as it reaches them overlaps the transfer with that compute.

Because all lists are appended in one global order, that order is itself an execution in which
every SEND meets its RECV (and every ALLREDUCE all its members) at the same point. So the lists
run without deadlock even when every send, receive and all-reduce blocks (rendezvous), which is
the strict model ``validate`` checks.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, Protocol

from trainer.schedule.actions import Action, Kind, ScheduleError
from trainer.schedule.topology import Topology

NOMINAL = {Kind.FORWARD: 1.0, Kind.BACKWARD: 2.0, Kind.BACKWARD_INPUT: 1.0, Kind.BACKWARD_WEIGHT: 1.0}

Ready = Callable[[Action], bool]


class Policy(Protocol):
    def choose(self, ready: Ready) -> Action | None:
        """The next action to start (removed from the policy), or None to wait for data."""

    def finished(self) -> bool: ...


class StaticPolicy:
    """A fixed order: the next action starts as soon as its inputs are there."""

    def __init__(self, ops: list[Action]) -> None:
        self.ops = deque(ops)

    def choose(self, ready: Ready) -> Action | None:
        if self.ops and ready(self.ops[0]):
            return self.ops.popleft()
        return None

    def finished(self) -> bool:
        return not self.ops


def act_key(stage: int, mb: int) -> tuple[int, int, int]:
    """Key of the activation that is the input of ``stage`` for microbatch ``mb``."""
    return (0, stage, mb)


def grad_key(stage: int, mb: int) -> tuple[int, int, int]:
    """Key of the gradient w.r.t. the output of ``stage`` for microbatch ``mb``."""
    return (1, stage, mb)


def place(topo: Topology, policies: list[Policy]) -> tuple[list[list[Action]], list[tuple]]:
    """The action lists, and the log of synchronising events in the order they happened:
    ("pair", sender, index, receiver, index) and ("all", worker, index, group size)."""
    last = topo.num_stages - 1
    n = topo.num_workers
    out: list[list[Action]] = [[] for _ in range(n)]
    have: list[set] = [set() for _ in range(n)]
    waiting = [False] * n
    heap: list[tuple[float, int, int, Action]] = []
    seq = 0
    # collective rendezvous: (stage, occurrence) -> members arrived so far
    entered: dict[tuple[int, int], list[int]] = {}
    ar_count: dict[tuple[int, int], int] = {}
    log: list[tuple] = []

    def ready_for(w: int) -> Ready:
        def ready(a: Action) -> bool:
            if a.kind is Kind.FORWARD:
                return a.stage == 0 or act_key(a.stage, a.microbatch) in have[w]
            if a.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
                return a.stage == last or grad_key(a.stage, a.microbatch) in have[w]
            return True

        return ready

    readies = [ready_for(w) for w in range(n)]

    def dispatch(w: int, now: float) -> None:
        nonlocal seq
        a = policies[w].choose(readies[w])
        if a is None:
            waiting[w] = not policies[w].finished()
            return
        waiting[w] = False
        if a.kind is Kind.ALLREDUCE:
            occ = (a.stage, ar_count.get((w, a.stage), 0))
            ar_count[(w, a.stage)] = occ[1] + 1
            members = entered.setdefault(occ, [])
            members.append(w)
            if len(members) == len(a.group or ()):
                del entered[occ]
                for m in sorted(members):
                    seq += 1
                    heapq.heappush(heap, (now, seq, m, a))
            return
        seq += 1
        heapq.heappush(heap, (now + NOMINAL.get(a.kind, 0.0), seq, w, a))

    def deliver(src: int, dst: int, send: Action, recv: Action, key: tuple[int, int, int], now: float) -> None:
        if dst == src:
            have[src].add(key)
            return
        out[src].append(send)
        out[dst].append(recv)
        log.append(("pair", src, len(out[src]) - 1, dst, len(out[dst]) - 1))
        have[dst].add(key)
        if waiting[dst]:
            dispatch(dst, now)

    for w in range(n):
        dispatch(w, 0.0)
    while heap:
        now, _, w, a = heapq.heappop(heap)
        out[w].append(a)
        if a.kind is Kind.ALLREDUCE:
            log.append(("all", w, len(out[w]) - 1, len(a.group or ())))
        s, mb = a.stage, a.microbatch
        if a.kind is Kind.FORWARD and s < last:
            dst = topo.rank_of(s + 1, mb)
            send = Action(Kind.SEND_ACT, s, mb, a.version, peer=dst)
            deliver(w, dst, send, Action(Kind.RECV_ACT, s + 1, mb, a.version, peer=w), act_key(s + 1, mb), now)
        elif a.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT) and s > 0:
            dst = topo.rank_of(s - 1, mb)
            send = Action(Kind.SEND_GRAD, s, mb, a.version, peer=dst)
            deliver(w, dst, send, Action(Kind.RECV_GRAD, s - 1, mb, a.version, peer=w), grad_key(s - 1, mb), now)
        dispatch(w, now)
    stuck = [w for w in range(n) if not policies[w].finished()]
    if stuck:
        raise ScheduleError(
            f"compute order cannot complete: workers {stuck[:8]} wait for inputs that never arrive"
        )
    return out, log
