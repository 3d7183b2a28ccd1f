"""Turn per-worker compute orders into full action lists with explicit sends and receives.

A builder decides only the order of computation on each worker (F, B or BI/W, ALLREDUCE, STEP):
its program. This module runs those orders once on a nominal clock (F = 1, B = 2, BI = W = 1,
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

from pipeboard.trainer.schedule.actions import Action, Kind, ScheduleError
from pipeboard.trainer.schedule.topology import Topology

# The nominal clock: only the order of events matters, not real stage times.
NOMINAL = {Kind.FORWARD: 1.0, Kind.BACKWARD: 2.0, Kind.BACKWARD_INPUT: 1.0, Kind.BACKWARD_WEIGHT: 1.0}


def place(topo: Topology, programs: list[list[Action]]) -> tuple[list[list[Action]], list[tuple]]:
    """The action lists of ``programs`` (each worker's compute order), and the log of
    synchronising events in the order they happened: ("pair", sender, index, receiver, index) and
    ("all", worker, index, group size).

    A worker starts its next action as soon as that action's input is there: data a worker has is
    keyed (0, stage, microbatch) for the activation that is the input of ``stage``, (1, stage,
    microbatch) for the gradient w.r.t. the output of ``stage``. (Written for speed: hundreds of
    thousands of actions at 64 stages x 1,024 microbatches; kinds are compared by identity.)"""
    forward, backward, backward_input = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT
    allreduce, send_act, recv_act, send_grad, recv_grad = (Kind.ALLREDUCE, Kind.SEND_ACT, Kind.RECV_ACT,
                                                           Kind.SEND_GRAD, Kind.RECV_GRAD)
    durations = {id(k): v for k, v in NOMINAL.items()}
    last = topo.num_stages - 1
    n = topo.num_workers
    out: list[list[Action]] = [[] for _ in range(n)]
    have: list[set] = [set() for _ in range(n)]
    nxt = [0] * n  # each worker's next action in its program
    sizes = [len(p) for p in programs]
    waiting = [False] * n  # for an input, with actions left
    heap: list[tuple[float, int, int, Action]] = []
    push, pop = heapq.heappush, heapq.heappop
    seq = 0
    # collective rendezvous: (stage, occurrence) -> members arrived so far
    entered: dict[tuple[int, int], list[int]] = {}
    ar_count: dict[tuple[int, int], int] = {}
    log: list[tuple] = []

    def dispatch(w: int, now: float) -> None:
        """Start worker ``w``'s next action if its input is there; else it waits."""
        nonlocal seq
        i = nxt[w]
        if i == sizes[w]:
            waiting[w] = False
            return
        a = programs[w][i]
        kind = a.kind
        if kind is forward:
            if a.stage != 0 and (0, a.stage, a.microbatch) not in have[w]:
                waiting[w] = True
                return
        elif kind is backward or kind is backward_input:
            if a.stage != last and (1, a.stage, a.microbatch) not in have[w]:
                waiting[w] = True
                return
        nxt[w] = i + 1
        waiting[w] = False
        if kind is allreduce:
            occ = (a.stage, ar_count.get((w, a.stage), 0))
            ar_count[(w, a.stage)] = occ[1] + 1
            members = entered.setdefault(occ, [])
            members.append(w)
            if len(members) == len(a.group or ()):
                del entered[occ]
                for m in sorted(members):
                    seq += 1
                    push(heap, (now, seq, m, a))
            return
        seq += 1
        push(heap, (now + durations.get(id(kind), 0.0), seq, w, a))

    stage_ranks = topo.stage_ranks  # topo.rank_of(s, mb), inline: ranks[mb % replicas]
    for w in range(n):
        dispatch(w, 0.0)
    while heap:
        now, _, w, a = pop(heap)
        mine = out[w]
        mine.append(a)
        kind = a.kind
        key = None  # the datum this action produces for another stage
        if kind is allreduce:
            log.append(("all", w, len(mine) - 1, len(a.group or ())))
        elif kind is forward:
            s, mb = a.stage, a.microbatch
            if s < last:
                ranks = stage_ranks[s + 1]
                dst, key = ranks[mb % len(ranks)], (0, s + 1, mb)
                if dst != w:
                    send = Action(send_act, s, mb, a.version, peer=dst)
                    recv = Action(recv_act, s + 1, mb, a.version, peer=w)
        elif kind is backward or kind is backward_input:
            s, mb = a.stage, a.microbatch
            if s > 0:
                ranks = stage_ranks[s - 1]
                dst, key = ranks[mb % len(ranks)], (1, s - 1, mb)
                if dst != w:
                    send = Action(send_grad, s, mb, a.version, peer=dst)
                    recv = Action(recv_grad, s - 1, mb, a.version, peer=w)
        if key is not None:
            if dst == w:  # the next stage is on this very worker (interleaved chunks)
                have[w].add(key)
            else:  # written on both sides now
                theirs = out[dst]
                mine.append(send)
                theirs.append(recv)
                log.append(("pair", w, len(mine) - 1, dst, len(theirs) - 1))
                have[dst].add(key)
                if waiting[dst]:
                    dispatch(dst, now)
        dispatch(w, now)
    stuck = [w for w in range(n) if nxt[w] < sizes[w]]
    if stuck:
        raise ScheduleError(
            f"compute order cannot complete: workers {stuck[:8]} wait for inputs that never arrive"
        )
    return out, log
