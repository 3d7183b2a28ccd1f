"""The simulator's inner loop, kept apart from its results so that it can be kept fast.

Each worker's actions become three flat lists (kind code, data key, duration); a worker walks
its list as far as it can and parks on the first input that has not been produced yet, and
producing that input wakes it, so every action is handled once. Timing model: see simulator.py.
numpy is imported inside the functions that use it (see stash.py).
"""

from __future__ import annotations

import gc
from bisect import bisect_right
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeboard.trainer.schedule.actions import Kind, Schedule, ScheduleError
from pipeboard.trainer.schedule.stash import CODES, batched_weight_counts, steps_keeping_version

if TYPE_CHECKING:
    import numpy as np

F, B, BI, W, SA, RA, SG, RG, AR, ST = (
    CODES[k]
    for k in (
        Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT, Kind.SEND_ACT,
        Kind.RECV_ACT, Kind.SEND_GRAD, Kind.RECV_GRAD, Kind.ALLREDUCE, Kind.STEP,
    )
)  # fmt: skip
# the loop relies on this numbering: computes first, then send/recv pairs with odd receives
assert (F, B, BI, W, SA, RA, SG, RG) == tuple(range(8))
WB = len(CODES)  # column of the duration table: a batched W's seconds per microbatch covered
COPY = WB + 1  # and a STEP's copy of the weights when it must keep the version it replaces


@contextmanager
def gc_paused():
    """The collector would rescan the 10^5 - 10^6 live actions again and again; pause it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class Program:
    """One worker's actions as columns: numpy for bulk work, lists for the loop."""

    code: np.ndarray
    stage: np.ndarray
    mb: np.ndarray
    dur: np.ndarray
    codes: list[int]
    keys: list[int]  # transfer: its datum; compute: the remote input it waits for, or -1; ALLREDUCE: group size
    durs: list[float]
    stages: list[int]  # (microbatches: read from ``mb`` where a transfer takes time; most take none)
    overlap: dict[int, int] | None = None  # index of an overlapped pair's forward -> its backward's


@dataclass
class Trace:
    """What the loop produced: per worker, the action index and start of each busy action."""

    index: list[list[int]]
    start: list[list[float]]
    transfers: list[tuple[int, int, int, int, float, float]]  # sender, code, sender stage, mb, start, end


def durations(costs) -> np.ndarray:
    """dur[stage, code] from a list of StageCosts (and dur[stage, WB]: a batched W per microbatch;
    dur[stage, COPY]: weight stashing's copy before a STEP that keeps the replaced version)."""
    import numpy as np
    table = np.zeros((len(costs), len(CODES) + 2))
    for i, c in enumerate(costs):
        for code, value in ((F, c.fwd_s), (B, c.bwd_s), (BI, c.bi_s), (W, c.w_s), (SA, c.send_act_s),
                            (SG, c.send_grad_s), (AR, c.allreduce_s), (ST, c.step_s),
                            (WB, c.w_batched_s), (COPY, c.stash_copy_s)):  # fmt: skip
            table[i, code] = value
    return table


def compile_programs(schedule: Schedule, cols: list[tuple], sources: list, dur: np.ndarray,
                     overlap_f_b: bool = False) -> list[Program]:
    """The loop's programs from ``cols`` (stash.schedule_columns); ``sources[w][i]`` is worker w's
    Action at index i wherever that is a compute, an ALLREDUCE (its group's size is read) or a
    STEP (the versions it keeps). ``overlap_f_b``:
    the pairs of ``meta["overlap_f_b"]`` run overlapped (actions.OverlapFB)."""
    import numpy as np
    S = schedule.num_stages
    # a compute waits for a transfer iff its input is received somewhere (on its own worker,
    # in a valid schedule); a datum is numbered (mb * S + receiving stage) * 2 + is_gradient
    received = np.zeros(2 * S * max(schedule.microbatches, 1) + 2 * S + 2, dtype=bool)
    for code, stage, mb, _ in cols:
        received[((mb * S + stage) * 2 + (code == RG))[(code == RA) | (code == RG)]] = True
    progs = []
    for acts, (code, stage, mb, _) in zip(sources, cols):
        base = (mb * S + stage) * 2
        key = np.select(
            [code == RA, code == RG, code == SA, code == SG, code == F, (code == B) | (code == BI)],
            [base, base + 1, base + 2, base - 1, base, base + 1],
            -1,
        )
        is_compute = code <= BI
        key[is_compute & ~received[np.where(is_compute, key, 0)]] = -1
        for i in np.flatnonzero(code == AR):
            key[i] = len(acts[i].group or ())
        d = dur[stage, code] if len(code) else np.zeros(0)
        for i, n in batched_weight_counts(code, stage, mb).items():
            d[i] = n * dur[stage[i], WB]
        if not schedule.meta.get("sync", True):  # only without a flush may a step outlive a version's use
            for i in steps_keeping_version(acts):
                d[i] += dur[stage[i], COPY]
        progs.append(
            Program(code, stage, mb, d, code.tolist(), key.tolist(), d.tolist(), stage.tolist())
        )
    if overlap_f_b:
        for prog, pairs in zip(progs, schedule.meta.get("overlap_f_b", ())):
            if pairs:
                prog.overlap = _pair_indices(prog, pairs)
    return progs


def _pair_indices(prog: Program, pairs: list[list[int]]) -> dict[int, int]:
    """Each pair's forward index -> its backward's, found by (kind, stage, microbatch); the build
    wrote the two with no compute between them."""
    where = {(c, s, m): i for i, (c, s, m) in enumerate(zip(prog.codes, prog.stages, prog.mb.tolist())) if c <= BI}
    out = {}
    for fs, fm, bs, bm in pairs:
        f = where.get((F, fs, fm))
        b = where.get((B, bs, bm), where.get((BI, bs, bm)))
        if f is None or b is None or b < f or any(prog.codes[k] <= W for k in range(f + 1, b)):
            raise ScheduleError(f"overlapped pair {fs}F{fm};{bs}B{bm}: not a forward followed by its backward")
        out[f] = b
    return out


class SharedLinks:
    """One link per pair of workers, carrying both directions one transfer at a time.

    The planner counts a stage boundary's activations and their gradients against one link's
    bandwidth; this is the same assumption. The loop meets transfers out of time order, so each
    takes the earliest gap on its link that starts no sooner than it is ready (a transfer placed
    earlier is never moved, so times already used stay valid).
    """

    def __init__(self) -> None:
        self.busy: dict[tuple[int, int], list[tuple[float, float]]] = {}

    def book(self, a: int, b: int, ready: float, d: float) -> float:
        spans = self.busy.setdefault((a, b) if a < b else (b, a), [])
        i = bisect_right(spans, (ready, float("inf")))
        begin = ready
        if i > 0 and spans[i - 1][1] > begin:
            begin = spans[i - 1][1]
        while i < len(spans) and spans[i][0] < begin + d:
            begin = max(begin, spans[i][1])
            i += 1
        spans.insert(i, (begin, begin + d))
        return begin


def run(schedule: Schedule, progs: list[Program], links: SharedLinks | None = None) -> Trace:
    """Walk the programs; ``links`` makes transfers between two workers share one link."""
    S, M = schedule.num_stages, schedule.microbatches
    nw = len(progs)
    nkeys = 2 * S * max(M, 1)
    send_post: list[float | None] = [None] * nkeys
    recv_post: list[float | None] = [None] * nkeys
    arrival: list[float | None] = [None] * nkeys
    sender = [0] * nkeys
    receiver = [0] * nkeys
    xfer = [0.0] * nkeys  # transfer time, known from the SEND
    parked = [-1] * nkeys  # worker waiting for the datum
    clock = [0.0] * nw
    pc = [0] * nw
    index: list[list[int]] = [[] for _ in range(nw)]
    start: list[list[float]] = [[] for _ in range(nw)]
    transfers: list[tuple] = []
    collective: dict[tuple[int, int], list[int]] = {}
    ar_seen: dict[tuple[int, int], int] = {}
    ready = list(range(nw - 1, -1, -1))
    # An overlapped pair (Program.overlap): from its forward's start to its backward, the
    # worker's receives are posted at the pair's start and the backward may start then too.
    pair_b = [-1] * nw  # index of the open pair's backward
    pair_t = [0.0] * nw  # the open pair's start

    while ready:
        w = ready.pop()
        p = progs[w]
        codes, keys, durs, overlap = p.codes, p.keys, p.durs, p.overlap
        ei, et, t, i, n = index[w], start[w], clock[w], pc[w], len(codes)
        while i < n:
            c = codes[i]
            if c <= W or c == ST:
                at = pair_t[w] if i == pair_b[w] else t
                if c <= W and (key := keys[i]) >= 0:
                    a = arrival[key]
                    if a is None:
                        parked[key] = w
                        break
                    if a > at:
                        at = a
                ei.append(i)
                et.append(at)
                end = at + durs[i]
                if end > t:  # a pair's backward may end before its forward
                    t = end
                if overlap is not None:
                    if i in overlap:
                        pair_b[w], pair_t[w] = overlap[i], at
                    elif i == pair_b[w]:
                        pair_b[w] = -1
            elif c <= RG:  # a transfer starts once both ends are posted
                key = keys[i]
                if c & 1:  # RECV_ACT, RECV_GRAD
                    recv_post[key], receiver[key] = (t if pair_b[w] < 0 else pair_t[w]), w
                    other = send_post[key]
                    if other is None:
                        i += 1
                        continue
                    d = xfer[key]
                else:
                    d = durs[i]
                    send_post[key], sender[key], xfer[key] = t, w, d
                    other = recv_post[key]
                    if other is None:
                        i += 1
                        continue
                begin = t if t > other else other
                if d > 0:  # listed in the timeline as the sender's (most transfers take no time)
                    if c & 1:
                        src, code, s = sender[key], c - 1, p.stages[i] + (1 if c == RG else -1)
                    else:
                        src, code, s = w, c, p.stages[i]
                    if links is not None:
                        begin = links.book(src, receiver[key], begin, d)
                    transfers.append((src, code, s, int(p.mb[i]), begin, begin + d))
                arrival[key] = begin + d
                if parked[key] >= 0:
                    ready.append(parked[key])
                    parked[key] = -1
            else:  # ALLREDUCE: the last member to arrive releases the group
                s = p.stages[i]
                occ = ar_seen.get((w, s), 0)
                ar_seen[(w, s)] = occ + 1
                members = collective.setdefault((s, occ), [])
                members.append(w)
                clock[w], pc[w] = t, i
                if len(members) < keys[i]:
                    i = -1  # parked until the group is complete
                    break
                del collective[(s, occ)]
                begin = max(clock[m] for m in members)
                for m in members:
                    index[m].append(pc[m])
                    start[m].append(begin)
                    clock[m], pc[m] = begin + progs[m].durs[pc[m]], pc[m] + 1
                    if m != w:
                        ready.append(m)
                t, i = clock[w], pc[w]
                continue
            i += 1
        if i >= 0:
            clock[w], pc[w] = t, i
    stuck = [w for w in range(nw) if pc[w] < len(progs[w].codes)]
    if stuck:
        raise ScheduleError(f"simulation stalled: workers {stuck[:8]} wait for data never sent (run validate)")
    return Trace(index, start, transfers)


@dataclass
class WorkerStats:
    busy: list[float]  # seconds per worker in compute, step, all-reduce
    compute: list[float]  # seconds per worker in F, B, BI, W
    t0: float
    t1: float
    steady_bubble: float | None
    steady_rate: float | None  # input-stage backwards per second within the steady state


def worker_stats(progs: list[Program], trace: Trace) -> WorkerStats:
    """What the summary needs from the loop's trace.

    The steady state runs from the last worker's first backward to the first worker's last
    forward (stats.py defines the same for any timeline). Its rate counts the backwards of the
    input stage that end inside it, from the first to the last of them.
    """
    import numpy as np
    busy, compute, first_b, last_f, lo, hi = [], [], {}, {}, [], []
    spans, input_ends = [], []
    for w, (p, idx, st) in enumerate(zip(progs, trace.index, trace.start)):
        idx = np.asarray(idx, dtype=np.int64)
        begin = np.asarray(st, dtype=np.float64)
        code, end = p.code[idx], begin + p.dur[idx]
        spans.append((begin, end))
        busy.append(float((end - begin).sum()))
        compute.append(float((end - begin)[code <= W].sum()))
        if len(idx):
            lo.append(float(begin.min()))
            hi.append(float(end.max()))
        bwd, fwd = (code == B) | (code == BI), code == F
        if bwd.any() and fwd.any():
            first_b[w], last_f[w] = float(begin[bwd].min()), float(end[fwd].max())
        input_ends.append(end[bwd & (p.stage[idx] == 0)])
    steady = rate = None
    if first_b:
        s0, s1 = max(first_b.values()), min(last_f.values())
        if s1 > s0:
            held = sum(
                float(np.clip(np.minimum(spans[w][1], s1) - np.maximum(spans[w][0], s0), 0, None).sum())
                for w in first_b
            )
            steady = max(0.0, 1.0 - held / ((s1 - s0) * len(first_b)))
            ends = np.sort(np.concatenate(input_ends))
            ends = ends[(ends >= s0) & (ends <= s1)]
            if len(ends) > 1 and ends[-1] > ends[0]:
                rate = (len(ends) - 1) / float(ends[-1] - ends[0])
    return WorkerStats(busy, compute, min(lo, default=0.0), max(hi, default=0.0), steady, rate)
