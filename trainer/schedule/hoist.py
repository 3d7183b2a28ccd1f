"""List activation receives early, and settle the receives so that blocking execution cannot hang.

``placement`` writes a RECV where the data is sent on its nominal clock. On real stage times the
sender may be faster, and a receive posted late delays the transfer. So every RECV_ACT moves up
to just before the compute that precedes its consumer (the forward of microbatch i+1 is posted
before the backward that runs before it), which leaves that compute for the transfer to overlap.

Moving receives up can create cycles in the all-blocking model (every SEND waits for its RECV):
in 1F1B's steady state stage s sends activation i to s+1 while s+1 sends gradient j to s, and
with blocking sends one of them must receive second. So the lists are replayed in that model;
where two workers wait for each other (or a longer cycle forms), one RECV sinks below the next
action that is not a receive, and the replay goes on. A gradient's receive sinks first, and a
receive that then passes only a send loses no overlap. Every sink puts one more non-receive above
a RECV and none goes below its consumer, so this ends. If nothing can sink, the workers it is
stuck at keep the placement's receives and it starts over; in the end the placement's lists,
which always run, are kept.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque

from trainer.schedule.actions import Action, Kind

INPUT_OF = {Kind.FORWARD: 0, Kind.BACKWARD: 1, Kind.BACKWARD_INPUT: 1}  # consumer -> 0 act, 1 grad
RECEIVES = {Kind.RECV_ACT: 0, Kind.RECV_GRAD: 1}


def _targets(actions: list[list[Action]], consumer: dict[tuple[int, int], int]) -> dict[tuple[int, int], int]:
    """(worker, RECV_ACT index) -> the index it should be listed before; ``consumer``: (worker,
    RECV index) -> index of the compute that uses the data."""
    moves = {}
    for w, acts in enumerate(actions):
        compute_at = [i for i, a in enumerate(acts) if a.kind.is_compute]
        for i, a in enumerate(acts):
            if a.kind is not Kind.RECV_ACT:
                continue
            k = bisect_left(compute_at, consumer[(w, i)])  # computes before the consumer: compute_at[:k]
            target = compute_at[k - 1] if k > 0 else 0
            if target < i:
                moves[(w, i)] = target
    return moves


def _apply(actions: list[list[Action]], moves: dict[tuple[int, int], int]) -> list[list[int]]:
    """Per worker, the original indices in their new order."""
    orders = []
    for w, acts in enumerate(actions):
        keys = [(moves[(w, i)], 0, i) if (w, i) in moves else (i, 1, i) for i in range(len(acts))]
        orders.append([k[2] for k in sorted(keys)])
    return orders


def _settle(
    orders: list[list[int]], log: list[tuple], consumer: dict[tuple[int, int], int], grads: set
) -> list[int]:
    """Replay with every send, receive and all-reduce blocking, repairing ``orders`` in place.

    Returns the workers it is stuck at where no receive can sink (see the module docstring), or [].
    """
    partner: dict[tuple[int, int], tuple] = {}
    i = 0
    while i < len(log):
        if log[i][0] == "pair":
            _, a, ia, b, ib = log[i]
            partner[(a, ia)], partner[(b, ib)] = ((b, ib),), ((a, ia),)
            i += 1
            continue
        members = tuple((m[1], m[2]) for m in log[i : i + log[i][3]])
        for m in members:
            partner[m] = tuple(x for x in members if x != m)
        i += len(members)
    n = len(orders)
    pc = [0] * n
    at = [order[0] if order else -1 for order in orders]
    blocked = [False] * n
    queue = deque(range(n))

    def step(w: int) -> None:
        pc[w] += 1
        at[w] = orders[w][pc[w]] if pc[w] < len(orders[w]) else -1

    def sink_target(w: int) -> int | None:
        """Where the RECV w waits at may go: below the next non-receive, above its consumer.

        It passes other receives as a block, but never one from the same peer: messages between
        two workers stay in order (the blocking model matches them in order)."""
        if (w, at[w]) not in consumer:
            return None
        o, j = orders[w], pc[w] + 1
        peer = partner[(w, at[w])][0][0]
        while j < len(o) and (w, o[j]) in consumer:
            if partner[(w, o[j])][0][0] == peer:
                return None
            j += 1
        return j if j < len(o) and o[j] != consumer[(w, at[w])] else None

    def sink_one(candidates: list[int]) -> bool:
        sink = {w: j for w in candidates if (j := sink_target(w)) is not None}
        if not sink:
            return False
        w = min(sink, key=lambda w: ((w, orders[w][sink[w]]) not in partner, (w, at[w]) not in grads, w))
        o = orders[w]
        o.insert(sink[w], o.pop(pc[w]))  # each sink puts one more non-receive above it, so this ends
        at[w] = o[pc[w]]
        blocked[w] = False
        queue.append(w)
        return True

    while True:
        # whoever arrives last at a rendezvous completes it, so nobody needs waking but its partners
        while queue:
            w = queue.popleft()
            while at[w] >= 0:
                others = partner.get((w, at[w]))
                if others is not None:
                    absent = [p for p, j in others if at[p] != j]
                    if absent:
                        blocked[w] = True
                        p = absent[0]  # two workers waiting for each other: sink one right away
                        if blocked[p] and any(q == w for q, _ in partner.get((p, at[p]), ())):
                            if sink_one([w, p]):
                                queue.append(p)
                        break
                    for p, _ in others:
                        step(p)
                        blocked[p] = False
                        queue.append(p)
                step(w)
            else:
                blocked[w] = False
        stuck = [w for w in range(n) if at[w] >= 0]
        if not stuck or not sink_one(stuck):  # done, or a cycle no sinking resolves
            return stuck


def hoist_receives(actions: list[list[Action]], log: list[tuple]) -> list[list[Action]]:
    consumer = {}
    for w, acts in enumerate(actions):
        use = {(INPUT_OF[a.kind], a.stage, a.microbatch): i for i, a in enumerate(acts) if a.kind in INPUT_OF}
        for i, a in enumerate(acts):
            if a.kind in RECEIVES:
                consumer[(w, i)] = use[(RECEIVES[a.kind], a.stage, a.microbatch)]
    grads = {(w, i) for w, i in consumer if actions[w][i].kind is Kind.RECV_GRAD}
    moves = _targets(actions, consumer)
    for _ in range(4):  # where no sinking helps, the stuck workers keep their receives in place
        orders = _apply(actions, moves)
        stuck = set(_settle(orders, log, consumer, grads))
        if not stuck:
            return [[acts[i] for i in order] for acts, order in zip(actions, orders)]
        moves = {k: v for k, v in moves.items() if k[0] not in stuck}
    return actions
