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

from pipeboard.trainer.schedule.actions import Action, Kind

class _Lists:
    """What the hoisting needs of each worker's list, read in one pass over its actions."""

    def __init__(self, acts: list[Action]) -> None:
        forward, backward, backward_input = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT
        recv_act, recv_grad, weight = Kind.RECV_ACT, Kind.RECV_GRAD, Kind.BACKWARD_WEIGHT
        n = len(acts)
        use: dict[tuple[int, int, int], int] = {}  # (0 activation | 1 gradient, stage, microbatch) -> consumer
        receives: list[int] = []
        compute_at: list[int] = []  # indices of the computes, ascending
        recv_acts: list[int] = []
        grads = bytearray(n)  # 1 at a RECV_GRAD
        computed, received = compute_at.append, receives.append
        for i, a in enumerate(acts):
            kind = a.kind
            if kind is forward:
                use[(0, a.stage, a.microbatch)] = i
                computed(i)
            elif kind is backward or kind is backward_input:
                use[(1, a.stage, a.microbatch)] = i
                computed(i)
            elif kind is weight:
                computed(i)
            elif kind is recv_act:
                received(i)
                recv_acts.append(i)
            elif kind is recv_grad:
                received(i)
                grads[i] = 1
        consumer = [-1] * n  # at a RECV: the index of the compute that uses its data
        for i in receives:
            a = acts[i]
            consumer[i] = use[(grads[i], a.stage, a.microbatch)]
        self.compute_at, self.recv_acts, self.grads, self.consumer = compute_at, recv_acts, grads, consumer


def _targets(lists: list[_Lists]) -> list[dict[int, int]]:
    """Per worker: RECV_ACT index -> the index it should be listed before (the compute before its
    consumer's)."""
    moves = []
    for one in lists:
        compute_at, uses = one.compute_at, one.consumer
        mine = {}
        for i in one.recv_acts:
            k = bisect_left(compute_at, uses[i])  # computes before the consumer: compute_at[:k]
            target = compute_at[k - 1] if k > 0 else 0
            if target < i:
                mine[i] = target
        moves.append(mine)
    return moves


def _apply(actions: list[list[Action]], moves: list[dict[int, int]]) -> list[list[int]]:
    """Per worker, the original indices in their new order: a moved RECV just before its target,
    after any other RECV moved there, in their original order."""
    orders = []
    for acts, mine in zip(actions, moves):
        n = len(acts)
        # (position, moved first, original index) as one integer, so the sort compares ints
        keys = [(i * 2 + 1) * n + i for i in range(n)]
        for i, target in mine.items():
            keys[i] = target * 2 * n + i
        keys.sort()
        orders.append([k % n for k in keys])
    return orders


NOBODY, GROUP = -1, -2  # an action that meets no one; an all-reduce (its members in ``groups``)


def _partners(orders: list[list[int]], log: list[tuple]):
    """Who each action meets: per worker and action index, the peer worker of a transfer (its
    other end) and that end's index, NOBODY, or GROUP for an all-reduce, whose other members
    (worker, index) are in ``groups[(worker, index)]``."""
    peer = [[NOBODY] * len(o) for o in orders]
    peer_at = [[0] * len(o) for o in orders]
    groups: dict[tuple[int, int], tuple] = {}
    i = 0
    while i < len(log):
        entry = log[i]
        if entry[0] == "pair":
            _, a, ia, b, ib = entry
            peer[a][ia], peer_at[a][ia], peer[b][ib], peer_at[b][ib] = b, ib, a, ia
            i += 1
            continue
        members = tuple((m[1], m[2]) for m in log[i : i + entry[3]])
        for m in members:
            peer[m[0]][m[1]] = GROUP
            groups[m] = tuple(x for x in members if x != m)
        i += len(members)
    return peer, peer_at, groups


def _settle(orders: list[list[int]], log: list[tuple], consumer: list[list[int]],
            grads: list[bytearray]) -> list[int]:
    """Replay with every send, receive and all-reduce blocking, repairing ``orders`` in place.

    Returns the workers it is stuck at where no receive can sink (see the module docstring), or [].
    (Hundreds of thousands of actions at 64 stages x 1,024 microbatches: per-worker lists indexed
    by action, no tuple keys, and the replay's steps written out inline.)
    """
    peer, peer_at, groups = _partners(orders, log)
    n = len(orders)
    lens = [len(o) for o in orders]
    pc = [0] * n
    at = [order[0] if order else -1 for order in orders]
    blocked = [False] * n
    queue = deque(range(n))

    def meets(p: int, w: int) -> bool:
        """Whether the action ``p`` waits at meets worker ``w``."""
        x = at[p]
        if x < 0:
            return False
        q = peer[p][x]
        if q >= 0:
            return q == w
        return q == GROUP and any(r == w for r, _ in groups[(p, x)])

    def sink_target(w: int) -> int | None:
        """Where the RECV w waits at may go: below the next non-receive, above its consumer.

        It passes other receives as a block, but never one from the same peer: messages between
        two workers stay in order (the blocking model matches them in order)."""
        x, uses = at[w], consumer[w]
        if x < 0 or uses[x] < 0:
            return None
        o, j, size, peers = orders[w], pc[w] + 1, lens[w], peer[w]
        sender = peers[x]
        while j < size and uses[o[j]] >= 0:
            if peers[o[j]] == sender:
                return None
            j += 1
        return j if j < size and o[j] != uses[x] else None

    def sink_one(candidates: list[int]) -> bool:
        best, best_key, best_j = -1, None, 0
        for w in candidates:
            j = sink_target(w)
            if j is None:
                continue
            # passing a send (loses no overlap) first, then a gradient's receive, then the lower rank
            key = (peer[w][orders[w][j]] == NOBODY, not grads[w][at[w]], w)
            if best_key is None or key < best_key:
                best, best_key, best_j = w, key, j
        if best < 0:
            return False
        o = orders[best]
        o.insert(best_j, o.pop(pc[best]))  # each sink puts one more non-receive above it, so this ends
        at[best] = o[pc[best]]
        blocked[best] = False
        queue.append(best)
        return True

    while True:
        # whoever arrives last at a rendezvous completes it, so nobody needs waking but its partners
        while queue:
            w = queue.popleft()
            o, peers, peers_at, size = orders[w], peer[w], peer_at[w], lens[w]
            x = at[w]
            while x >= 0:
                q = peers[x]
                if q >= 0:  # a transfer: both ends must be there
                    if at[q] != peers_at[x]:
                        blocked[w] = True  # two workers waiting for each other: sink one right away
                        if blocked[q] and meets(q, w) and sink_one([w, q]):
                            queue.append(q)
                        break
                    k = pc[q] + 1
                    pc[q] = k
                    at[q] = orders[q][k] if k < lens[q] else -1
                    blocked[q] = False
                    queue.append(q)
                elif q == GROUP:  # an all-reduce: every member must be there
                    others = groups[(w, x)]
                    absent = next((p for p, j in others if at[p] != j), -1)
                    if absent >= 0:
                        blocked[w] = True
                        if blocked[absent] and meets(absent, w) and sink_one([w, absent]):
                            queue.append(absent)
                        break
                    for p, _ in others:
                        k = pc[p] + 1
                        pc[p] = k
                        at[p] = orders[p][k] if k < lens[p] else -1
                        blocked[p] = False
                        queue.append(p)
                k = pc[w] + 1
                pc[w] = k
                x = at[w] = o[k] if k < size else -1
            else:
                blocked[w] = False
        stuck = [w for w in range(n) if at[w] >= 0]
        if not stuck or not sink_one(stuck):  # done, or a cycle no sinking resolves
            return stuck


def hoist_receives(actions: list[list[Action]], log: list[tuple]) -> list[list[Action]]:
    lists = [_Lists(acts) for acts in actions]
    consumer, grads = [one.consumer for one in lists], [one.grads for one in lists]
    moves = _targets(lists)
    for _ in range(4):  # where no sinking helps, the stuck workers keep their receives in place
        orders = _apply(actions, moves)
        stuck = set(_settle(orders, log, consumer, grads))
        if not stuck:
            return [[acts[i] for i in order] for acts, order in zip(actions, orders)]
        moves = [{} if w in stuck else mine for w, mine in enumerate(moves)]
    return actions
