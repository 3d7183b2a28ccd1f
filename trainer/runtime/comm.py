"""Point-to-point transfers between stage workers, with receives posted before they are needed.

A stage boundary ``b`` (between virtual stages ``b`` and ``b + 1``) carries a fixed tuple of
tensors per microbatch; their shapes and dtypes are known up front (``BoundarySpec``), so a
receive can be posted long before its data is sent. Sends are ``isend`` and complete in the
background. A blocking transfer can cost as much as a small microbatch's compute, so nothing on
the critical path waits for a transfer that could have been overlapped.

Dynamic dimensions (a sequence length that differs between batches, ``TensorSpec.dynamic``): the
spec's shape holds the largest size there (or the example's where none is known), and each message
carries its own sizes to the receiver. Over gloo/NCCL a small int64 header (the sizes, in spec
order) goes first under its own tag; the receive posts the header early and, at ``wait``, the
tensors at the sizes it names. Over shared memory the sizes ride in the slot's header
(``shm.NSIZES``). A boundary without dynamic dimensions sends exactly what it did before.

Tags keep concurrent transfers apart: (microbatch mod 4096, boundary, direction, tensor index).
NCCL ignores them and pairs a rank's transfers with its peer's in issue order, so under NCCL the
executor posts each receive at its own action (runtime/posting.py says why and checks it).

Transport: ``RunConfig.p2p``, else ``PIPEBOARD_P2P``, else ``auto`` (``p2p_mode``). ``auto``, the
default, sends between CPU workers on one host (same hostname and boot id, ``host_id``) through
shared memory (``pipeboard.trainer.runtime.shm``: one channel per directed pair, set up by
``open_channels``), and through the world process group (gloo) between hosts, where shared
memory is unsupported (``shm.supported``: Linux on x86_64 with /dev/shm) and where a host's
channels would take more than half of its free /dev/shm. ``shm`` does the same but is an error
where shared memory is unsupported or too small; ``gloo`` always uses the process group. CUDA
workers on different GPUs use NCCL whatever the setting; CUDA workers sharing a GPU go through
host memory by the setting (``staged`` peers; docs/runtime.md, "Several stages on one GPU").
Shared memory is the default because a same-host transfer then costs one slot copy and a futex wake instead of a gloo send through the loopback socket, far less CPU, which counts
most where the runtime's fixed cost per step is most of the step (docs/runtime.md, "Transfers",
has the measurements).
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipeboard.trainer.runtime import shm
from pipeboard.trainer.runtime.run_config import P2P_MODES

TAG_MB_WINDOW = 4096
MAX_TENSORS = 16
RECV_POLL_S = 20e-6  # between checks of a GPU receive's completion (a few kernel launches)


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]  # the largest shape (the example's where a dynamic size has no known largest)
    dtype: torch.dtype
    dynamic: tuple[int, ...] = ()  # dimensions whose size varies from microbatch to microbatch

    @property
    def carries_grad(self) -> bool:
        """Whether a gradient flows back for this tensor (floating point only)."""
        return self.dtype.is_floating_point


@dataclass(frozen=True)
class BoundarySpec:
    """The tensors that cross one stage boundary for one microbatch."""

    tensors: tuple[TensorSpec, ...]
    bounded: bool = True  # every dynamic size has a known largest (shared-memory slots need one)

    @property
    def grads(self) -> tuple[TensorSpec, ...]:
        return tuple(t for t in self.tensors if t.carries_grad)


def dynamic_dims(specs: list[BoundarySpec]) -> dict[tuple[int, bool], list[tuple[int, int]]]:
    """(tensor index, dimension) of each dynamic size a message carries, by (boundary, is_grad)."""
    return {(b, g): [(i, d) for i, t in enumerate(s.grads if g else s.tensors) for d in t.dynamic]
            for b, s in enumerate(specs) for g in (False, True)}


HEADER_INDEX = MAX_TENSORS - 1  # the tag index of a message's sizes header (dynamic boundaries)


def tag(boundary: int, microbatch: int, is_grad: bool, index: int, num_boundaries: int) -> int:
    return (((microbatch % TAG_MB_WINDOW) * max(num_boundaries, 1) + boundary) * 2 + int(is_grad)) * MAX_TENSORS + index


class PendingRecv:
    """A posted receive of one boundary's tensors; ``wait`` returns them."""

    __slots__ = ("works", "buffers", "done")

    def __init__(self, works, buffers):
        self.works = works
        self.buffers = buffers
        self.done = False

    def wait(self) -> list[torch.Tensor]:
        if not self.done:
            on_gpu = bool(self.buffers) and self.buffers[0].is_cuda
            for w in self.works:
                if on_gpu:
                    # NCCL's wait() only makes the current stream wait and returns at once, so the
                    # heartbeat's "waiting" flag around this call would bracket nothing and a hang
                    # would be blamed on whichever stage next reads the clock. Polling the work's
                    # CUDA event holds the CPU here until the data has arrived; what it costs is
                    # the consumer's kernel launches, which start after the arrival, not before.
                    while not w.is_completed():
                        time.sleep(RECV_POLL_S)
                w.wait()
            self.done = True
        return self.buffers


def message_shapes(specs: list[BoundarySpec]) -> dict[tuple[int, bool], list[tuple[torch.Size, torch.dtype]]]:
    """(shape, dtype) of each tensor a message carries, by (boundary, is_grad)."""
    return {(b, g): [(t.shape, t.dtype) for t in (s.grads if g else s.tensors)]
            for b, s in enumerate(specs) for g in (False, True)}


class SizedRecv:
    """A posted receive of a message with dynamic sizes: the header was posted; ``wait`` reads it,
    then receives the tensors at those sizes."""

    __slots__ = ("header", "p2p", "key", "peer", "buffers")

    def __init__(self, header: PendingRecv, p2p: "P2P", key: tuple[int, int, bool], peer: int) -> None:
        self.header, self.p2p, self.key, self.peer, self.buffers = header, p2p, key, peer, None

    def wait(self) -> list[torch.Tensor]:
        if self.buffers is None:
            boundary, mb, is_grad = self.key
            sizes = self.header.wait()[0].tolist()
            shapes = [list(shape) for shape, _ in self.p2p.shapes_of(boundary, is_grad)]
            for (i, d), size in zip(self.p2p.dynamic_of(boundary, is_grad), sizes):
                shapes[i][d] = size
            self.buffers = self.p2p._recv_tensors(boundary, mb, is_grad, self.peer, shapes).wait()
        return self.buffers


class StagedRecv:
    """A receive from a rank on this run's own GPU, through host memory: ``wait`` takes the host
    tensors the CPU transport delivered and copies them to the device (pinned buffers: the copy
    is queued on the current stream, before the consumer's kernels)."""

    __slots__ = ("inner", "device", "buffers")

    def __init__(self, inner, device: torch.device) -> None:
        self.inner, self.device, self.buffers = inner, device, None

    def wait(self) -> list[torch.Tensor]:
        if self.buffers is None:
            self.buffers = [t.to(self.device, non_blocking=True) for t in self.inner.wait()]
        return self.buffers


class ShmRecv:
    """A receive from a shared-memory channel: ``wait`` takes exactly its message, in any order."""

    __slots__ = ("channel", "key", "shapes_of", "buffers")

    def __init__(self, channel: shm.Channel, key: tuple[int, int, bool], shapes_of) -> None:
        self.channel, self.key, self.shapes_of, self.buffers = channel, key, shapes_of, None

    def wait(self) -> list[torch.Tensor]:
        if self.buffers is None:
            self.buffers = self.channel.take(*self.key, self.shapes_of)
        return self.buffers


class P2P:
    """Posts receives and sends for one worker. ``specs[b]`` describes boundary ``b``; peers in
    ``channels_out`` / ``channels_in`` (rank -> shm.Channel) go through shared memory."""

    def __init__(self, specs: list[BoundarySpec], device: torch.device, channels_out: dict | None = None,
                 channels_in: dict | None = None, staged: frozenset[int] = frozenset(), nccl_group=None) -> None:
        if any(len(s.tensors) > MAX_TENSORS for s in specs):
            raise ValueError(f"a stage boundary carries more than {MAX_TENSORS} tensors")
        if any(len(s.tensors) > HEADER_INDEX and any(t.dynamic for t in s.tensors) for s in specs):
            raise ValueError(f"a stage boundary with dynamic sizes carries more than {HEADER_INDEX} tensors")
        self.specs = specs
        self.device = device
        # The world's ProcessGroup, called directly: dist.isend/irecv add Python argument checks
        # that cost more than the ProcessGroup call itself (docs/runtime.md, "Transfers"), and a
        # stage posts two transfers per microbatch on its critical path.
        self.pg = dist.group.WORLD
        self.sends: deque = deque()  # (work, tensors) kept alive until complete
        self.channels_out: dict[int, shm.Channel] = channels_out or {}
        self.channels_in: dict[int, shm.Channel] = channels_in or {}
        self._shapes = message_shapes(specs)
        self._dynamic = dynamic_dims(specs)
        # Peers on this worker's own GPU (NCCL refuses two ranks on one device): their tensors go
        # through host memory over the world group (gloo) or a shared-memory channel; every other
        # peer's over ``nccl_group`` where one is given (a run whose world group is gloo), else the world.
        self.staged = frozenset(staged)
        self.nccl_group = nccl_group
        self._pin = device.type == "cuda"  # pinned host buffers: the device copies run at DMA speed

    def shapes_of(self, boundary: int, is_grad: bool):
        return self._shapes[(boundary, is_grad)]

    def dynamic_of(self, boundary: int, is_grad: bool) -> list[tuple[int, int]]:
        return self._dynamic[(boundary, is_grad)]

    def drain_incoming(self) -> None:
        for ch in self.channels_in.values():
            ch.drain(self.shapes_of)

    def close(self) -> None:
        for ch in list(self.channels_out.values()) + list(self.channels_in.values()):
            ch.close()
        self.channels_out, self.channels_in = {}, {}

    def _tag(self, boundary: int, mb: int, is_grad: bool, i: int) -> int:
        return tag(boundary, mb, is_grad, i, len(self.specs))

    def _pg(self, peer: int):
        return self.nccl_group if self.nccl_group is not None and peer not in self.staged else self.pg

    def _on_host(self, peer: int) -> bool:
        return peer in self.staged or self.device.type == "cpu"

    def post_recv(self, boundary: int, mb: int, is_grad: bool, peer: int):
        got = self._post_recv(boundary, mb, is_grad, peer)
        return StagedRecv(got, self.device) if peer in self.staged and self.device.type != "cpu" else got

    def _post_recv(self, boundary: int, mb: int, is_grad: bool, peer: int):
        ch = self.channels_in.get(peer)
        if ch is not None:
            return ShmRecv(ch, (boundary, mb, is_grad), self.shapes_of)
        dynamic = self._dynamic[(boundary, is_grad)]
        if dynamic:
            header = torch.empty(len(dynamic), dtype=torch.int64, device="cpu" if self._on_host(peer) else self.device)
            work = self._pg(peer).recv([header], peer, self._tag(boundary, mb, is_grad, HEADER_INDEX))
            return SizedRecv(PendingRecv([work], [header]), self, (boundary, mb, is_grad), peer)
        return self._recv_tensors(boundary, mb, is_grad, peer, [shape for shape, _ in self.shapes_of(boundary, is_grad)])

    def _recv_tensors(self, boundary: int, mb: int, is_grad: bool, peer: int, shapes) -> PendingRecv:
        works, bufs = [], []
        host = self._on_host(peer)
        pg = self._pg(peer)
        for i, (shape, (_, dtype)) in enumerate(zip(shapes, self.shapes_of(boundary, is_grad))):
            if host:
                buf = torch.empty(shape, dtype=dtype, pin_memory=self._pin)
            else:
                buf = torch.empty(shape, dtype=dtype, device=self.device)
            works.append(pg.recv([buf], peer, self._tag(boundary, mb, is_grad, i)))
            bufs.append(buf)
        return PendingRecv(works, bufs)

    def check(self, tensors: list[torch.Tensor], boundary: int, is_grad: bool) -> None:
        """ValueError in one line where a message differs from its boundary's spec (count, dtype,
        or a size the spec fixes): a receiver would read it into the wrong buffer."""
        spec = self.shapes_of(boundary, is_grad)
        dyn = {(i, d) for i, d in self._dynamic[(boundary, is_grad)]}
        if len(tensors) != len(spec):
            raise ValueError(f"boundary {boundary}: {len(tensors)} tensors sent, its spec has {len(spec)}")
        for i, (t, (shape, dtype)) in enumerate(zip(tensors, spec)):
            if t.dtype != dtype or t.dim() != len(shape) or any(
                    t.shape[d] != n for d, n in enumerate(shape) if (i, d) not in dyn):
                raise ValueError(f"boundary {boundary}{' gradient' if is_grad else ''} tensor {i}: sent "
                                 f"{tuple(t.shape)} {t.dtype}, its spec is {tuple(shape)} {dtype}")

    def send(self, tensors: list[torch.Tensor], boundary: int, mb: int, is_grad: bool, peer: int) -> None:
        self.check(tensors, boundary, is_grad)
        ch = self.channels_out.get(peer)
        dynamic = self._dynamic[(boundary, is_grad)]
        if ch is not None:  # a GPU tensor is copied into the slot (the copy waits for its kernels)
            ch.send(tensors, boundary, mb, is_grad, while_full=self.drain_incoming, sizes=dynamic)
            return
        host = self._on_host(peer)
        pg = self._pg(peer)
        if dynamic:
            header = torch.tensor([tensors[i].shape[d] for i, d in dynamic], dtype=torch.int64)
            header = header if host else header.to(self.device)
            self.sends.append((pg.send([header], peer, self._tag(boundary, mb, is_grad, HEADER_INDEX)), header))
        for i, t in enumerate(tensors):
            t = t.detach()
            if host and t.device.type != "cpu":
                # staged: into a pinned buffer; the copy returns once the tensor's kernels and the
                # copy itself are done, so the CPU transport reads finished data
                staged = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                staged.copy_(t)
                t = staged
            elif not t.is_contiguous():
                t = t.contiguous()
            work = pg.send([t], peer, self._tag(boundary, mb, is_grad, i))
            self.sends.append((work, t))
        # Drop finished sends from the front so their buffers can be freed.
        while self.sends and self.sends[0][0].is_completed():
            self.sends.popleft()

    def flush(self) -> None:
        """Wait for every send posted so far."""
        while self.sends:
            work, _ = self.sends.popleft()
            work.wait()


SLOT_BUDGET_BYTES = 256 << 20  # per channel


def p2p_mode(configured: str | None) -> str:
    """The transport ``configured`` (else ``$PIPEBOARD_P2P``) names; ``auto`` by default, for the
    reason in the module docstring. ValueError names a bad one."""
    mode = configured or os.environ.get("PIPEBOARD_P2P") or "auto"
    if mode not in P2P_MODES:
        raise ValueError(f"p2p: must be one of {', '.join(P2P_MODES)}, got {mode!r}")
    return mode


def node_name() -> str:
    """This host's name as reports show it: ``$PIPEBOARD_NODE_NAME`` (what the service calls the
    host; two worker hosts on one machine have different ones), else the host name."""
    return os.environ.get("PIPEBOARD_NODE_NAME") or socket.gethostname()


def host_id() -> str:
    """Same value on workers that share /dev/shm: host (node) name and boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{node_name()}/{boot}"


def open_channels(mode: str, rank: int, world: int, pairs: set[tuple[int, int]], specs: list[BoundarySpec],
                  slots: int, prefix: str | None, timeout_s: float) -> tuple[dict, dict]:
    """Collective over the (gloo) world group: every rank calls it with the same ``pairs`` (directed
    (src, dst) rank pairs that transfer). Returns this rank's (channels_out, channels_in) for the
    pairs on one host; the others stay on gloo. Channel files are unlinked before returning."""
    if mode == "gloo" or world < 2:
        return {}, {}
    unbounded = any(not s.bounded for s in specs)
    too_many = any(len(v) > shm.MAX_SIZES for v in dynamic_dims(specs).values())
    if unbounded or too_many:
        if mode == "shm":
            why = ("a dynamic size has no known largest (declare it in Task.dynamic_dims)" if unbounded else
                   f"a message has more than {shm.MAX_SIZES} dynamic dimensions")
            raise RuntimeError(f"p2p: shared memory transport needs fixed-size slots: {why}; use p2p 'auto' or 'gloo'")
        return {}, {}
    if not shm.supported():
        if mode == "shm":
            raise RuntimeError("p2p: shared memory transport needs Linux on x86_64 with /dev/shm")
        return {}, {}
    sizes = [shm.packed_bytes(shapes) for shapes in message_shapes(specs).values()]
    slot_bytes = max(sizes, default=shm.ALIGN)
    slots = max(2, min(slots, SLOT_BUDGET_BYTES // slot_bytes))
    # /dev/shm is a size-limited tmpfs (64 MiB in a default container): writing a mapped page it
    # cannot hold kills the worker with SIGBUS. Before any rank creates a file, each host's
    # channels must fit in half of what is free there (torch shares tensors through /dev/shm
    # too); where they do not, "auto" keeps gloo and "shm" is an error.
    hosts: list = [None] * world
    dist.all_gather_object(hosts, (host_id(), shm.free_bytes()))
    per_host: dict = {}
    for a, b in pairs:
        if a != b and hosts[a][0] == hosts[b][0]:
            per_host[hosts[a][0]] = per_host.get(hosts[a][0], 0) + shm.channel_bytes(slots, slot_bytes)
    short = {h: need for h, need in per_host.items() if 2 * need > min(free for hid, free in hosts if hid == h)}
    if short and mode == "shm":
        h, need = next(iter(short.items()))
        raise RuntimeError(f"p2p: shared memory channels need {need / 2**20:.0f} MiB of /dev/shm on {h.split('/')[0]}, "
                           f"more than is free; give the container a larger shm_size or use p2p 'auto' or 'gloo'")
    names = [prefix or f"pipeboard-{os.getpid()}-{os.urandom(4).hex()}"]
    dist.broadcast_object_list(names, src=0)
    local = sorted((a, b) for a, b in pairs if hosts[a][0] == hosts[b][0] and a != b and hosts[a][0] not in short)
    out, inc = {}, {}
    try:
        for src, dst in local:
            if src == rank:
                out[dst] = shm.Channel(shm.channel_path(names[0], src, dst), slots, slot_bytes, True, dst, timeout_s)
        dist.barrier()
        for src, dst in local:
            if dst == rank:
                inc[src] = shm.Channel(shm.channel_path(names[0], src, dst), slots, slot_bytes, False, src, timeout_s)
        dist.barrier()
    finally:  # mapped by both sides (or failed): nothing needs the names any more
        for src, dst in local:
            if src == rank:
                try:
                    os.unlink(shm.channel_path(names[0], src, dst))
                except FileNotFoundError:
                    pass
    return out, inc
