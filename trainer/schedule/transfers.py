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

While it writes, it notes what hoisting the receives needs (hoist.py): who meets whom, and which
compute uses each receive's data, so that no later pass reads the lists again. It writes columns,
not ``Action`` objects (see ``Placement.written``): the builder's own actions are kept, and a
transfer is six numbers until someone reads the schedule's lists (actions.ActionColumns).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeboard.trainer.schedule.actions import Action, Kind, ScheduleError
from pipeboard.trainer.schedule.stash import CODES
from pipeboard.trainer.schedule.topology import Topology

WIDTH = 7  # values per action in ``Placement.written``
NO_PEER = -1  # the peer (and its index) written for an action that is not a transfer

# The nominal clock: only the order of events matters, not real stage times. Whole numbers, so
# that the events of one tick can be kept in one list (see ``place``).
NOMINAL = {Kind.FORWARD: 1, Kind.BACKWARD: 2, Kind.BACKWARD_INPUT: 1, Kind.BACKWARD_WEIGHT: 1}


@dataclass
class Placement:
    """The placed action lists, and what the hoisting needs to know of them.

    - ``written[w]``: worker ``w``'s list as ``WIDTH`` values per action, in order: kind code
      (stash.CODES), stage, microbatch, version, the peer worker and the index of the other end
      in its list (both ``NO_PEER`` unless a transfer), and the builder's Action (None for a
      transfer written here); one flat list, extended once per action, and cut into columns once
      (hoist.py);
    - ``sizes[w]``: the number of actions in it;
    - ``groups``: each all-reduce, its members' (worker, index of their ALLREDUCE);
    - ``consumer[w]``: index of a RECV on ``w`` -> index of the compute that uses its data;
    - ``before_consumer[w]``: index of a RECV_ACT on ``w`` -> index of the compute listed right
      before its consumer (-1: none);
    """

    written: list[list]
    sizes: list[int]
    groups: list[tuple[tuple[int, int], ...]]
    consumer: list[dict[int, int]]
    before_consumer: list[dict[int, int]]


def place(topo: Topology, programs: list[list[Action]]) -> Placement:
    """The action lists of ``programs`` (each worker's compute order), in the order the nominal
    clock runs them.

    A worker starts its next action as soon as that action's input is there. A datum is numbered
    ``(microbatch * stages + stage) * 2`` for the activation that is the input of ``stage``, that
    plus 1 for the gradient w.r.t. the output of ``stage``. The clock's times are whole, so the
    events due at one time are one list, in the order they were started (what a heap ordered by
    (time, start order) would give). Written for speed: hundreds of thousands of actions at 64
    stages x 1,024 microbatches; kinds are compared by identity (looking a member up on the Enum
    class is a Python-level call) and key dictionaries directly (``Kind`` is a str Enum: it
    hashes as its str, in C).
    """
    forward, backward, backward_input, weight = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT
    allreduce, send_act, recv_act, send_grad, recv_grad = (Kind.ALLREDUCE, Kind.SEND_ACT, Kind.RECV_ACT,
                                                           Kind.SEND_GRAD, Kind.RECV_GRAD)
    ticks = NOMINAL  # keyed by Kind: a str Enum hashes as its str, in C
    num_stages = topo.num_stages
    last = num_stages - 1
    stage_ranks = topo.stage_ranks  # topo.rank_of(s, mb), inline: ranks[mb % replicas]
    n = topo.num_workers
    out: list[list] = [[] for _ in range(n)]  # Placement.written
    count = [0] * n  # actions written to each list
    code_of = CODES  # kind -> the code the columns hold (stash.CODES)
    have: list[dict[int, int]] = [{} for _ in range(n)]  # datum -> index of its RECV, -1 if made here
    consumer: list[dict[int, int]] = [{} for _ in range(n)]
    before_consumer: list[dict[int, int]] = [{} for _ in range(n)]
    last_compute = [-1] * n  # index of the latest compute in each list
    nxt = [0] * n  # each worker's next action in its program
    sizes = [len(p) for p in programs]
    waiting = [False] * n  # for an input, with actions left
    awaiting = [-1] * n  # the datum a waiting worker waits for
    running: list[Action | None] = [None] * n  # the action each busy worker has started
    input_at = [-1] * n  # index of the RECV whose data the running action uses, or -1
    groups: list[tuple[tuple[int, int], ...]] = []
    forming: list[tuple[int, int]] = []  # members of the all-reduce being written (they end together)
    # collective rendezvous: (stage, occurrence) -> members arrived so far
    entered: dict[tuple[int, int], list[int]] = {}
    ar_count: dict[tuple[int, int], int] = {}
    due: list[list[int]] = [[], [], []]  # due[t]: the workers whose action ends at time t, in start order

    def start(w: int, now: int) -> None:
        """Start worker ``w``'s next action if its input is there; else it waits."""
        i = nxt[w]
        if i == sizes[w]:
            waiting[w] = False
            return
        a = programs[w][i]
        kind = a.kind
        got = -1
        if kind is forward:
            if a.stage != 0:
                key = (a.microbatch * num_stages + a.stage) * 2
                got = have[w].get(key)
                if got is None:
                    waiting[w], awaiting[w] = True, key
                    return
        elif kind is backward or kind is backward_input:
            if a.stage != last:
                key = (a.microbatch * num_stages + a.stage) * 2 + 1
                got = have[w].get(key)
                if got is None:
                    waiting[w], awaiting[w] = True, key
                    return
        nxt[w] = i + 1
        waiting[w] = False
        if kind is allreduce:
            stage = a.stage
            occ = ar_count.get((w, stage), 0)
            ar_count[(w, stage)] = occ + 1
            members = entered.setdefault((stage, occ), [])
            members.append(w)
            if len(members) == len(a.group or ()):
                del entered[(stage, occ)]
                for m in sorted(members):
                    running[m] = a
                    input_at[m] = -1
                    due[now].append(m)
            return
        running[w] = a
        input_at[w] = got
        due[now + ticks.get(kind, 0)].append(w)

    for w in range(n):
        start(w, 0)
    now = 0
    while True:
        for w in due[now]:  # grows while it is read: an action of no duration ends at once
            a = running[w]
            mine = out[w]
            index = count[w]
            count[w] = index + 1
            kind = a.kind
            mine += (code_of[kind], a.stage, a.microbatch, a.version, -1, -1, a)
            if kind is forward or kind is backward or kind is backward_input:
                got = input_at[w]
                if got >= 0:  # the last compute that uses a datum counts
                    consumer[w][got] = index
                    if kind is forward:
                        before_consumer[w][got] = last_compute[w]
                last_compute[w] = index
                s, mb = a.stage, a.microbatch
                if kind is forward:
                    if s == last:
                        start(w, now)
                        continue
                    ranks = stage_ranks[s + 1]
                    key = (mb * num_stages + s + 1) * 2
                    sending, receiving, there = send_act, recv_act, s + 1
                else:
                    if s == 0:
                        start(w, now)
                        continue
                    ranks = stage_ranks[s - 1]
                    key = (mb * num_stages + s - 1) * 2 + 1
                    sending, receiving, there = send_grad, recv_grad, s - 1
                dst = ranks[mb % len(ranks)]
                if dst == w:  # the next stage is on this very worker (interleaved chunks)
                    have[w][key] = -1
                else:  # written on both sides now
                    count[w] = index + 2
                    received = count[dst]
                    count[dst] = received + 1
                    mine += (code_of[sending], s, mb, a.version, dst, received, None)
                    out[dst] += (code_of[receiving], there, mb, a.version, w, index + 1, None)
                    have[dst][key] = received
                    if waiting[dst] and awaiting[dst] == key:  # start(dst, now), knowing its input is here
                        i = nxt[dst]
                        nxt[dst] = i + 1
                        waiting[dst] = False
                        b = running[dst] = programs[dst][i]
                        input_at[dst] = received
                        due[now + ticks.get(b.kind, 0)].append(dst)
            elif kind is weight:
                last_compute[w] = index
            elif kind is allreduce:
                forming.append((w, index))
                if len(forming) == len(a.group or ()):
                    groups.append(tuple(forming))
                    forming = []
            start(w, now)
        if not due[now + 1] and not due[now + 2]:
            break
        due[now] = []
        due.append([])
        now += 1
    stuck = [w for w in range(n) if nxt[w] < sizes[w]]
    if stuck:
        raise ScheduleError(
            f"compute order cannot complete: workers {stuck[:8]} wait for inputs that never arrive"
        )
    return Placement(out, count, groups, consumer, before_consumer)
