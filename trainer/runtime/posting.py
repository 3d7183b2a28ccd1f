"""When a worker posts its receives, and a model of NCCL's in-order matching to judge that order.

The executor may post a receive ahead of the action that lists it, so that the transfer
overlaps the computation before its consumer. Whether that is safe depends on the transport:

- gloo and the shared-memory channels match a receive to its send by tag (boundary,
  microbatch, direction), so a receive posted early waits for its own message and lets the
  others pass: any lookahead is safe.
- NCCL ignores tags. Between two ranks, ``ProcessGroupNCCL`` runs separate sends and receives on
  one communicator and stream, in the order they were issued, and the k-th operation of one rank
  pairs with the k-th of the other. A receive posted ahead of a send to the same peer makes both
  ranks wait in a receive: 1F1B on two stages posted ``recv G0..G3`` then ``send A0`` on the
  first rank, and ``recv A0..A3`` then ``send G0`` on the second, a deadlock at step 0.

So under NCCL the lookahead is 0: each receive is posted at its own action, in the order the
schedule lists it, and the schedules are checked to run when every transfer blocks in that
order (trainer/schedule/validator.py), which is stricter than NCCL.

``issued_transfers`` writes what one worker issues for a lookahead, and ``nccl_outcome`` replays
every worker's issue order under NCCL's rules (tests/trainer/test_runtime_posting.py and
bench/gpu_smoke.sh use them over every registered schedule).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from pipeboard.trainer.schedule.actions import Action, Kind

RECV = (Kind.RECV_ACT, Kind.RECV_GRAD)
SEND = (Kind.SEND_ACT, Kind.SEND_GRAD)
NCCL_LOOKAHEAD = 0  # receives posted at their own action: the only order NCCL cannot deadlock
TAGGED_LOOKAHEAD = 8  # gloo and shared memory match by tag: receives may run this far ahead


def lookahead_for(backend: str) -> int:
    """How many receives may be posted ahead of their action on ``backend``'s transport."""
    return NCCL_LOOKAHEAD if backend == "nccl" else TAGGED_LOOKAHEAD


def run_lookahead(devices, pairs) -> int:
    """The lookahead of every worker of a run whose rank r is on GPU ``devices[r]`` (None: a CPU
    run) and whose ranks transfer along ``pairs``: 0 as soon as one pair goes over NCCL (ranks on
    different GPUs), even for workers whose own peers share their GPU; only a run with no NCCL
    pair at all (CPU, or every stage on one GPU, all through host memory) posts ahead. One
    worker posting ahead towards a host-staged peer while another pairs in order over NCCL can
    deadlock (tests/trainer/test_runtime_posting.py shows it over the registered schedules)."""
    if devices is None:
        return TAGGED_LOOKAHEAD
    nccl = any(devices[a] != devices[b] for a, b in pairs if a != b)
    return NCCL_LOOKAHEAD if nccl else TAGGED_LOOKAHEAD


def recv_key(a: Action) -> tuple[int, int, int]:
    """(0 for an activation / 1 for a gradient, stage, microbatch): what the consumer asks for."""
    return (0 if a.kind is Kind.RECV_ACT else 1, a.stage, a.microbatch)


def _consumer_key(a: Action) -> tuple[int, int, int] | None:
    if a.kind is Kind.FORWARD:
        return (0, a.stage, a.microbatch)
    if a.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
        return (1, a.stage, a.microbatch)
    return None


def receive_posts(actions: list[Action], lookahead: int) -> dict[int, list[int]]:
    """Action index -> positions of the receives posted just before that action runs.

    Every receive is posted no later than its own position; besides, while fewer than
    ``lookahead`` posted receives wait for their consumer, the next receives in list order are
    posted early. A receive's consumer is the forward (activation) or backward (gradient) of its
    stage and microbatch; a consumer that ran frees its receive's place in the window."""
    positions = [i for i, a in enumerate(actions) if a.kind in RECV]
    posts: dict[int, list[int]] = defaultdict(list)
    outstanding: set[tuple[int, int, int]] = set()
    nxt = 0
    for i, a in enumerate(actions):
        while nxt < len(positions) and (positions[nxt] <= i or len(outstanding) < lookahead):
            posts[i].append(positions[nxt])
            outstanding.add(recv_key(actions[positions[nxt]]))
            nxt += 1
        consumed = _consumer_key(a)
        if consumed is not None:
            outstanding.discard(consumed)
    return dict(posts)


@dataclass(frozen=True)
class Issued:
    """One operation a worker issues: ``recv``/``send`` to ``peer`` of ``key``, or ``compute``
    that needs the receives in ``needs`` (waited on before it is issued)."""

    op: str
    peer: int = -1
    key: tuple[int, int, int] = (0, 0, 0)
    needs: tuple[tuple[int, int, int], ...] = ()


def _message_key(a: Action) -> tuple[int, int, int]:
    """The message a transfer carries, the same on both sides: (direction, boundary, microbatch)."""
    if a.kind in (Kind.SEND_ACT, Kind.RECV_ACT):
        return (0, a.stage if a.kind is Kind.SEND_ACT else a.stage - 1, a.microbatch)
    return (1, a.stage - 1 if a.kind is Kind.SEND_GRAD else a.stage, a.microbatch)


def issued_transfers(actions: list[Action], lookahead: int) -> list[Issued]:
    """What the executor issues for one worker's ``actions``, in order, at ``lookahead``."""
    posts = receive_posts(actions, lookahead)
    posted: dict[tuple[int, int, int], tuple[int, int, int]] = {}  # consumer key -> message key
    out: list[Issued] = []
    for i, a in enumerate(actions):
        for j in posts.get(i, ()):
            r = actions[j]
            posted[recv_key(r)] = _message_key(r)
            out.append(Issued("recv", r.peer, _message_key(r)))
        if a.kind in SEND:
            out.append(Issued("send", a.peer, _message_key(a)))
        elif a.kind not in RECV:
            consumed = _consumer_key(a)
            needs = (posted.pop(consumed),) if consumed in posted else ()
            out.append(Issued("compute", needs=needs))
    return out


def nccl_outcome(programs: list[list[Issued]], tagged=frozenset()) -> str:
    """Replay every worker's issued operations under NCCL's rules: ``"ok"``, ``"deadlock"`` or
    ``"mismatch"`` (a receive paired with a different message than it was posted for).

    The rules, as ProcessGroupNCCL runs them on a GPU: one compute stream per worker runs its
    computes in order, each after the receives it waited on; one stream per pair of workers runs
    their sends and receives in issue order, each after every compute issued before it (the
    stream waits on the compute stream when the operation is issued). The k-th operation of
    worker a towards b pairs with the k-th of b towards a, whatever the tags; a send and a receive
    complete together (a send may wait for its receive: NCCL guarantees no buffering).

    ``tagged``: the pairs (frozensets of two workers) that go through host memory instead (two
    stages on one GPU: gloo or a shared-memory channel), matched by message whatever the order:
    a send is handed over once the computes issued before it are done (its host copy waits for
    them), and a receive completes once its message was handed over."""
    n = len(programs)
    done = [[False] * len(p) for p in programs]
    recv_done: list[set] = [set() for _ in range(n)]
    queues: list[dict[int, list[int]]] = []  # worker -> peer -> its operation indices, in order
    for p in programs:
        q: dict[int, list[int]] = defaultdict(list)
        for j, op in enumerate(p):
            if op.op != "compute":
                q[op.peer].append(j)
        queues.append(q)
    heads = [defaultdict(int) for _ in range(n)]
    compute_done_upto = [0] * n  # computes before this index are all done
    next_compute = [0] * n

    def computes_before_done(w: int, j: int) -> bool:
        return all(done[w][k] for k in range(compute_done_upto[w], j) if programs[w][k].op == "compute")

    handed: set = set()  # (sender, receiver, message) over tagged pairs
    progress = True
    while progress:
        progress = False
        for a in range(n):
            for b, qa in queues[a].items():
                if frozenset((a, b)) not in tagged:
                    continue
                for j in qa:
                    o = programs[a][j]
                    if done[a][j] or not computes_before_done(a, j):
                        continue
                    if o.op == "send" and (a, b, o.key) not in handed:
                        handed.add((a, b, o.key))
                        progress = True
                    elif o.op == "recv" and (b, a, o.key) in handed:
                        done[a][j] = progress = True
                        recv_done[a].add(o.key)
                        for jb in queues[b].get(a, []):
                            ob = programs[b][jb]
                            if ob.op == "send" and ob.key == o.key:
                                done[b][jb] = True
        for w in range(n):  # computes, in order, once their receives are done
            p = programs[w]
            while next_compute[w] < len(p):
                j = next_compute[w]
                if p[j].op != "compute":
                    next_compute[w] += 1
                    continue
                if not all(k in recv_done[w] for k in p[j].needs):
                    break
                done[w][j] = progress = True
                next_compute[w] += 1
        for a in range(n):
            for b, qa in queues[a].items():
                if b < a or b >= n or frozenset((a, b)) in tagged:
                    continue
                qb = queues[b].get(a, [])
                while heads[a][b] < len(qa) and heads[b][a] < len(qb):
                    ja, jb = qa[heads[a][b]], qb[heads[b][a]]
                    if not (computes_before_done(a, ja) and computes_before_done(b, jb)):
                        break
                    oa, ob = programs[a][ja], programs[b][jb]
                    if {oa.op, ob.op} != {"send", "recv"}:
                        break  # two receives (or two sends) wait for each other for good
                    if oa.key != ob.key:
                        return "mismatch"
                    done[a][ja] = done[b][jb] = progress = True
                    for w, o in ((a, oa), (b, ob)):
                        if o.op == "recv":
                            recv_done[w].add(o.key)
                    heads[a][b] += 1
                    heads[b][a] += 1
    return "ok" if all(all(d) for d in done) else "deadlock"
