"""Measure the point-to-point link between two worker processes on this machine.

Two processes (forked, one torch thread each, as the runtime's workers) exchange tensors over
the transport to measure (``transport`` below): gloo through ``dist.isend``/``dist.irecv`` (the
operations ``comm.P2P`` posts, though it calls the world process group's ``send``/``recv``
directly, without ``dist``'s per-call Python checks), or a shared-memory channel. They do so in
the situation the runtime's transfers meet: the receiver has posted its receive and waits for the
data while the sender computes, posts the send and computes on. Per message: a handshake (not
timed), the sender spins ``busy_ms``, posts the send (timed: what posting costs the sender),
spins again, then waits for the send; the receiver notes when its ``wait`` returns. A gloo
all-reduce between the two (``allreduce_latency_ms``, ``allreduce_bytes_per_ms``) is timed the
same way: both spin ``busy_ms``, then all-reduce, as a replicated stage's workers do.
``perf_counter`` is the system-wide monotonic clock, so arrival minus post is one transfer, from
the send being posted to the data being usable at the receiver. (A ping-pong, where both
processes sit blocked between messages, measures the idle cores' wake-up instead, which a busy
pipeline does not pay; docs/profile-format.md, ``link``, has the figure.) A least-squares line
through the median one-way times gives ``latency_ms`` and ``bytes_per_ms``; ``post_ms`` is the
least per-size median (posting does not depend on the size; interference from other processes
only adds to it).

``transport``: the runtime's stage-to-stage transport to measure, as ``RunConfig.p2p`` names it;
by default the one a local run uses (``auto``: a shared-memory channel, ``pipeboard.trainer.runtime.shm``,
where the machine supports it). Over shm the timed message is one ``Channel.send`` and the
receiver's ``Channel.take``; the handshake stays on gloo.
"""

from __future__ import annotations

import statistics
import time

import torch

from pipeboard.trainer.profile.calibration_records import Link

DEFAULT_SIZES = (4096, 65536, 1 << 20, 4 << 20)
ALLREDUCE_SIZES = (4096, 1 << 20, 4 << 20)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _open_channel(rank: int, size: int):
    """The runtime's own shared-memory channel (``comm.open_channels``) from rank 0 to rank 1, for
    one float32 message of ``size`` bytes: rank 0 gets its sending end, rank 1 its receiving end."""
    from pipeboard.trainer.runtime.comm import BoundarySpec, TensorSpec, open_channels

    spec = BoundarySpec((TensorSpec((max(1, size // 4),), torch.float32),))
    out, inc = open_channels("shm", rank, 2, {(0, 1)}, [spec], 2, None, timeout_s=60.0)
    return out[1] if rank == 0 else inc[0]


def _one_way(rank: int, port: int, sizes: tuple[int, ...], repeats: int, busy_s: float, transport: str,
             out) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        token = torch.zeros(1)
        for k, size in enumerate(sizes):
            buf = torch.ones(max(1, size // 4), dtype=torch.float32)
            shapes = [(buf.shape, buf.dtype)]
            channel = _open_channel(rank, size) if transport == "shm" else None
            marks = []
            for i in range(repeats + 3):  # the first messages set up the pair's connection
                tag = (k * (repeats + 3) + i) * 2
                if rank == 0:
                    dist.irecv(token, src=1, tag=tag + 1).wait()  # the receiver has posted
                    _spin(busy_s)
                    t0 = time.perf_counter()
                    work = channel.send([buf], 0, i, False) if channel else dist.isend(buf, dst=1, tag=tag)
                    t1 = time.perf_counter()
                    _spin(2 * busy_s)
                    if work is not None:
                        work.wait()
                    marks.append((t0, t1 - t0))
                elif channel:
                    dist.isend(token, dst=0, tag=tag + 1).wait()
                    channel.take(0, i, False, lambda b, g: shapes)
                    marks.append((time.perf_counter(), 0.0))
                else:
                    work = dist.irecv(buf, src=0, tag=tag)
                    dist.isend(token, dst=0, tag=tag + 1).wait()
                    work.wait()
                    marks.append((time.perf_counter(), 0.0))
            if channel:
                channel.close()
            out.put((rank, size, marks[3:]))
        for size in ALLREDUCE_SIZES:  # what a replicated stage's gradient all-reduce costs (gloo)
            buf = torch.ones(max(1, size // 4), dtype=torch.float32)
            spans = []
            dist.barrier()
            for _ in range(repeats + 3):
                # both computed since the last one ended, as replicas do between all-reduces (an
                # all-reduce straight after a barrier, idle processes, takes a fraction of it)
                _spin(busy_s)
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                spans.append(time.perf_counter() - t0)
            out.put((rank, -size, [(t, 0.0) for t in spans[3:]]))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def runtime_transport(configured: str | None = None) -> str:
    """What a local CPU run's transfers go through, "shm" or "gloo" (``RunConfig.p2p`` semantics)."""
    from pipeboard.trainer.runtime import shm
    from pipeboard.trainer.runtime.comm import p2p_mode

    mode = p2p_mode(configured)
    return "shm" if mode != "gloo" and shm.supported() else "gloo"


def fit_link(samples: list[list[float]], backend: str = "gloo") -> Link:
    """Latency and bandwidth of the least-squares line through (bytes, one-way ms)."""
    if len(samples) < 2:
        raise ValueError("fit_link needs at least two sizes")
    xs = [s[0] for s in samples]
    ys = [s[1] for s in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("fit_link needs at least two different sizes")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    latency = my - slope * mx
    if latency < 0:
        # No latency is negative: the least-squares line under latency >= 0 then goes through
        # the origin, and its slope changes with it (keeping the free fit's slope with latency
        # cut to 0 under-predicted every size).
        latency, slope = 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    slope = max(slope, 1e-12)  # a flat line: bandwidth beyond what the sizes can tell
    # posting costs the same whatever the size; another process taking the core meanwhile only
    # ever adds to it, so the least of the per-size medians is the cost
    post = min(s[2] for s in samples)
    return Link(latency_ms=latency, bytes_per_ms=1.0 / slope, post_ms=post, backend=backend,
                samples=[list(s) for s in samples])


def measure_link(sizes: tuple[int, ...] = DEFAULT_SIZES, repeats: int = 20, busy_ms: float = 2.0,
                 timeout_s: float = 120.0, rounds: int = 3, transport: str | None = None) -> Link:
    """One-way transfers between two fresh processes on this machine over ``transport`` ("gloo"
    or "shm"; default: the local runtime's, see ``runtime_transport``); see the module docstring.
    ``rounds`` pairs of processes measure in turn and each size keeps its least medians: another
    process taking a core meanwhile (a shared machine) only ever adds time."""
    if repeats < 1 or rounds < 1 or len(set(sizes)) < 2:
        raise ValueError("measure_link needs repeats >= 1, rounds >= 1 and at least two different sizes")
    transport = transport or runtime_transport()
    if transport not in ("gloo", "shm"):
        raise ValueError(f"measure_link: transport must be 'gloo' or 'shm', got {transport!r}")
    rows = [_measure_round(tuple(sizes), repeats, busy_ms, timeout_s, transport) for _ in range(rounds)]
    best = [[per_size[0][0], min(r[1] for r in per_size), min(r[2] for r in per_size)] for per_size in zip(*rows)]
    link = fit_link([b for b in best if b[0] > 0], backend=transport)
    # a two-process gloo all-reduce, as a line through its sizes (negative in the rows)
    reduce = fit_link([[-b[0], b[1], 0.0] for b in best if b[0] < 0])
    link.allreduce_latency_ms, link.allreduce_bytes_per_ms = reduce.latency_ms, reduce.bytes_per_ms
    return link


def _measure_round(sizes: tuple[int, ...], repeats: int, busy_ms: float, timeout_s: float,
                   transport: str) -> list[list[float]]:
    import torch.multiprocessing as mp

    from pipeboard.trainer.runtime.launch import free_port

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    args = (port, tuple(sizes), repeats, busy_ms / 1e3, transport, q)
    procs = [ctx.Process(target=_one_way, args=(r, *args), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = {}
        for _ in range(2 * (len(sizes) + len(ALLREDUCE_SIZES))):
            rank, size, marks = q.get(timeout=timeout_s)
            got[(rank, size)] = marks
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    rows = []
    for size in sizes:
        sent, arrived = got[(0, size)], got[(1, size)]
        one_way = [(a - s) * 1e3 for (s, _), (a, _) in zip(sent, arrived)]
        rows.append([float(max(1, size // 4) * 4), statistics.median(one_way), statistics.median(p * 1e3 for _, p in sent)])
    for size in ALLREDUCE_SIZES:  # the slower rank's time: both wait for the collective to end
        spans = [max(a, b) * 1e3 for (a, _), (b, _) in zip(got[(0, -size)], got[(1, -size)])]
        rows.append([-float(max(1, size // 4) * 4), statistics.median(spans), 0.0])
    return rows
