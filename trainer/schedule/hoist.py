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

from collections import deque
from operator import itemgetter
from typing import TYPE_CHECKING

from pipeboard.trainer.schedule.actions import ActionColumns, Kind, ScheduleError
from pipeboard.trainer.schedule.transfers import NO_PEER, WIDTH
from pipeboard.trainer.schedule.stash import CODES

if TYPE_CHECKING:
    from pipeboard.trainer.schedule.transfers import Placement


def _targets(placed: Placement, receives: list[int]) -> list[dict[int, int]]:
    """Per worker: RECV_ACT index -> the index it should be listed before (the compute before its
    consumer's, or the top), where that is above it."""
    moves = []
    for w, before in enumerate(placed.before_consumer):
        if len(placed.consumer[w]) != receives[w]:
            raise ScheduleError(f"worker {w} receives data that none of its computes uses")
        moves.append({i: (c if c > 0 else 0) for i, c in before.items() if c < i})
    return moves


def _apply(sizes: list[int], moves: list[dict[int, int]]) -> list[list[int]]:
    """Per worker, the original indices in their new order: a moved RECV just before its target,
    after any other RECV moved there, in their original order."""
    orders = []
    for n, mine in zip(sizes, moves):
        order: list[int] = []
        there: dict[int, list[int]] = {}  # target -> the receives moved before it
        for i in sorted(mine):
            there.setdefault(mine[i], []).append(i)
        begin = 0  # the next original index not yet written
        for cut in sorted(there.keys() | mine.keys()):
            order.extend(range(begin, cut))
            if cut in there:
                order.extend(there[cut])
            begin = cut + 1 if cut in mine else cut
        order.extend(range(begin, n))
        orders.append(order)
    return orders


NOBODY, GROUP = NO_PEER, -2  # an action that meets no one; an all-reduce (its members in ``groups``)
RECV_GRAD = CODES[Kind.RECV_GRAD]
_RECEIVES = (CODES[Kind.RECV_ACT], RECV_GRAD)


def _partners(placed: Placement):
    """Who each action meets: per worker and action index, the peer worker of a transfer (its
    other end) and that end's index, NOBODY, or GROUP for an all-reduce, whose other members
    (worker, index) are in ``groups[(worker, index)]``; how many receives each worker has; and
    each action's kind code (stash.CODES)."""
    written = placed.written
    peer = [mine[4::WIDTH] for mine in written]  # the placement wrote both ends of each transfer
    peer_at = [mine[5::WIDTH] for mine in written]
    codes = [mine[0::WIDTH] for mine in written]
    receives = [sum(map(code.count, _RECEIVES)) for code in codes]
    groups: dict[tuple[int, int], tuple] = {}
    for members in placed.groups:
        for m in members:
            peer[m[0]][m[1]] = GROUP
            groups[m] = tuple(x for x in members if x != m)
    return peer, peer_at, groups, receives, codes


def _settle(orders: list[list[int]], peer: list[list[int]], peer_at: list[list[int]], groups: dict,
            consumer: list[dict[int, int]], codes: list[list[int]]) -> list[int]:
    """Replay with every send, receive and all-reduce blocking, repairing ``orders`` in place.

    Returns the workers it is stuck at where no receive can sink (see the module docstring), or [].
    (Hundreds of thousands of actions at 64 stages x 1,024 microbatches: per-worker lists indexed
    by action, no tuple keys, and the replay's steps written out inline; a worker's position is
    kept in locals while it walks and written back where it stops.)
    """
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
        if x < 0 or x not in uses:
            return None
        o, j, size, peers = orders[w], pc[w] + 1, lens[w], peer[w]
        sender = peers[x]
        while j < size and o[j] in uses:
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
            key = (peer[w][orders[w][j]] == NOBODY, codes[w][at[w]] != RECV_GRAD, w)
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
            k, x = pc[w], at[w]
            while x >= 0:
                q = peers[x]
                if q >= 0:  # a transfer: both ends must be there
                    y = at[q]
                    if y != peers_at[x]:
                        pc[w], at[w], blocked[w] = k, x, True
                        # two workers waiting for each other: sink one right away (``meets(q, w)``,
                        # inline where q waits for a transfer)
                        if blocked[q] and y >= 0:
                            r = peer[q][y]
                            if (r == w or (r == GROUP and meets(q, w))) and sink_one([w, q]):
                                queue.append(q)
                        break
                    j = pc[q] + 1
                    pc[q] = j
                    at[q] = orders[q][j] if j < lens[q] else -1
                    blocked[q] = False
                    queue.append(q)
                elif q == GROUP:  # an all-reduce: every member must be there
                    others = groups[(w, x)]
                    absent = next((p for p, j in others if at[p] != j), -1)
                    if absent >= 0:
                        pc[w], at[w], blocked[w] = k, x, True
                        if blocked[absent] and meets(absent, w) and sink_one([w, absent]):
                            queue.append(absent)
                        break
                    for p, _ in others:
                        j = pc[p] + 1
                        pc[p] = j
                        at[p] = orders[p][j] if j < lens[p] else -1
                        blocked[p] = False
                        queue.append(p)
                k += 1
                x = o[k] if k < size else -1
            else:
                pc[w], at[w], blocked[w] = k, x, False
        stuck = [w for w in range(n) if at[w] >= 0]
        if not stuck or not sink_one(stuck):  # done, or a cycle no sinking resolves
            return stuck


def hoist_receives(placed: Placement) -> list[ActionColumns]:
    """The placed lists with their activation receives moved up and settled (module docstring)."""
    peer, peer_at, groups, receives, codes = _partners(placed)
    moves = _targets(placed, receives)
    sizes = placed.sizes
    for _ in range(4):  # where no sinking helps, the stuck workers keep their receives in place
        orders = _apply(sizes, moves)
        stuck = set(_settle(orders, peer, peer_at, groups, placed.consumer, codes))
        if not stuck:
            return [_columns(written, order) for written, order in zip(placed.written, orders)]
        moves = [{} if w in stuck else mine for w, mine in enumerate(moves)]
    return [_columns(written, range(size)) for written, size in zip(placed.written, sizes)]


def _columns(written: list, order) -> ActionColumns:
    """One worker's written values (``Placement.written``) as columns, in ``order``.

    One itemgetter of the whole order picks each column in C, without a Python-level call per
    value (as ``map(column.__getitem__, order)`` makes); it returns a bare value, not a tuple,
    for a single index, so short lists take the plain way."""
    if len(order) < 2:
        return ActionColumns(*([written[k::WIDTH][i] for i in order] for k in (0, 1, 2, 3, 4, 6)))
    pick = itemgetter(*order)
    return ActionColumns(*(list(pick(written[k::WIDTH])) for k in (0, 1, 2, 3, 4, 6)))
