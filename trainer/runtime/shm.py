"""Same-host stage-to-stage transfers through shared memory, woken by futexes.

One ``Channel`` per directed pair of workers (``src`` sends, ``dst`` receives): a file in
/dev/shm mapped by both, holding a channel header and ``slots`` fixed-size slots. A slot has a
header (state, microbatch, boundary, direction, and the sizes of any dynamic dimensions) and room
for the largest boundary's tensors packed one after another (at their largest sizes). The sender copies a message's tensors into a free slot once, marks it
full and bumps the channel's ``posted`` counter; the receiver copies every full slot out into
tensors it owns (a private stash keyed by (boundary, microbatch, direction), so messages may be
consumed in any order), marks the slots free and bumps ``freed``. Each counter has one writer.

Waiting costs no CPU: a side with nothing to do sleeps in FUTEX_WAIT on the counter the other
side bumps (shared futexes: the kernel keys them by file and offset, so both mappings match),
waking only every ``WAIT_SLICE_S`` to check its deadline.
A sender finding every slot full sleeps on ``freed`` (back-pressure) after draining its own
incoming channels, so two workers sending to each other cannot both block on full slots.

Why not gloo here: a gloo send writes through the loopback socket in the sending thread, and
gloo's background threads compete with compute; a slot copy and a futex wake cost a small
fraction of that CPU (docs/runtime.md, "Transfers", has the figures).
The counters are plain stores ordered by x86's total store order (``supported()`` requires it).

Cleanup: ``comm.open_channels`` unlinks the files as soon as both sides have mapped them, so a
killed worker leaves nothing behind after set-up; the launcher removes its run's prefix on every
exit (``remove_prefix``) for a worker killed during set-up.
"""

from __future__ import annotations

import ctypes
import glob
import math
import mmap
import os
import platform
import time

import torch

SHM_DIR = "/dev/shm"
HEADER_INTS = 32  # per channel and per slot: 128 bytes, two cache lines each
ALIGN = 64
POSTED, FREED = 0, 1  # channel header words
STATE, MB, BOUNDARY, IS_GRAD, NSIZES = 0, 1, 2, 3, 4  # slot header words
# After NSIZES: (tensor index << 8 | dimension, size) pairs, one per dynamic dimension of the message
# (a sequence length that varies between microbatches): the receiver's shapes are the spec's
# largest ones with these sizes put in.
MAX_SIZES = (HEADER_INTS - NSIZES - 1) // 2
FREE, FULL = 0, 1
SYS_FUTEX = 202  # x86_64
FUTEX_WAIT, FUTEX_WAKE = 0, 1
WAIT_SLICE_S = 0.5  # a sleeper wakes this often to notice its deadline


def supported() -> bool:
    return platform.system() == "Linux" and platform.machine() == "x86_64" and os.path.isdir(SHM_DIR)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc = None


def _futex():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall


_SLICE = _Timespec(int(WAIT_SLICE_S), int((WAIT_SLICE_S % 1) * 1e9))


def futex_wait(addr: int, expected: int) -> None:
    """Sleep while the int32 at ``addr`` equals ``expected`` (or until woken / a slice passes)."""
    _futex()(ctypes.c_long(SYS_FUTEX), ctypes.c_void_p(addr), ctypes.c_int(FUTEX_WAIT), ctypes.c_int(expected),
             ctypes.byref(_SLICE), ctypes.c_void_p(0), ctypes.c_int(0))


def futex_wake(addr: int) -> None:
    _futex()(ctypes.c_long(SYS_FUTEX), ctypes.c_void_p(addr), ctypes.c_int(FUTEX_WAKE), ctypes.c_int(1 << 30),
             ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_int(0))


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _nbytes(shape, dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def packed_bytes(shapes_dtypes) -> int:
    """Bytes one message of these tensors takes in a slot (each tensor 64-byte aligned)."""
    return max(sum(_aligned(_nbytes(shape, dtype)) for shape, dtype in shapes_dtypes), ALIGN)


def channel_bytes(slots: int, slot_bytes: int) -> int:
    """The size of one channel's file (what ``Channel`` maps)."""
    return _aligned(HEADER_INTS * 4 * (1 + slots)) + slots * _aligned(slot_bytes)


def free_bytes() -> int:
    """Bytes free on /dev/shm (0 where it cannot be read)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def channel_path(prefix: str, src: int, dst: int) -> str:
    return os.path.join(SHM_DIR, f"{prefix}-{src}-{dst}")


def remove_prefix(prefix: str) -> list[str]:
    """Unlink every channel file of a run (a worker killed before its channels were unlinked)."""
    gone = []
    for path in glob.glob(os.path.join(SHM_DIR, glob.escape(prefix) + "-*")):
        try:
            os.unlink(path)
            gone.append(path)
        except FileNotFoundError:
            pass
    return gone


class Channel:
    """One direction between two workers; ``create`` on the sender, ``open`` on the receiver."""

    def __init__(self, path: str, slots: int, slot_bytes: int, create: bool, peer: int, timeout_s: float) -> None:
        self.path, self.slots, self.slot_bytes, self.peer = path, slots, _aligned(slot_bytes), peer
        self.timeout_s = timeout_s
        header = HEADER_INTS * 4 * (1 + slots)
        self.data_offset = _aligned(header)
        size = channel_bytes(slots, slot_bytes)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)  # zero-filled: every slot FREE, counters 0
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.ints = memoryview(self.mm)[:header].cast("i")
        self.bytes = torch.frombuffer(self.mm, dtype=torch.uint8)
        self.base = self.bytes.data_ptr()
        self.next_slot = 0
        self._view_cache: dict[tuple[int, int, bool], list[torch.Tensor]] = {}
        self.stash: dict[tuple[int, int, bool], list[torch.Tensor]] = {}

    def _slot_word(self, slot: int, word: int) -> int:
        return HEADER_INTS * (1 + slot) + word

    def _message_views(self, slot: int, boundary: int, is_grad: bool, shapes_dtypes) -> list[torch.Tensor]:
        """The slot's tensors for a message of this boundary and direction, made once: building
        the views costs Python time on every message, as much as the copy of a small message
        itself (docs/runtime.md, "Transfers")."""
        key = (slot, boundary, is_grad)
        views = self._view_cache.get(key)
        if views is None:
            views = self._view_cache[key] = self._views(slot, shapes_dtypes)
        return views

    def _views(self, slot: int, shapes_dtypes) -> list[torch.Tensor]:
        off = self.data_offset + slot * self.slot_bytes
        out = []
        for shape, dtype in shapes_dtypes:
            nbytes = _nbytes(shape, dtype)
            out.append(self.bytes[off:off + nbytes].view(dtype).view(shape))
            off += _aligned(nbytes)
        return out

    # ---- sender side --------------------------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], boundary: int, mb: int, is_grad: bool, while_full=None,
             sizes: list[tuple[int, int]] | None = None) -> None:
        """Copy ``tensors`` into a free slot; when none is free, run ``while_full()`` (drain this
        worker's own incoming channels) and sleep until the receiver frees one. ``sizes``: the
        (tensor index, dimension) pairs whose sizes vary by message, written into the header."""
        ints = self.ints
        slot = self._free_slot()
        deadline = None
        while slot is None:
            seen = ints[FREED]
            if while_full is not None:
                while_full()
            slot = self._free_slot()
            if slot is not None:
                break
            deadline = deadline or time.monotonic() + self.timeout_s
            if time.monotonic() > deadline:
                raise TimeoutError(f"shared-memory send to rank {self.peer}: every slot full for {self.timeout_s:.0f} s")
            futex_wait(self.base + FREED * 4, seen)
            slot = self._free_slot()
        w = HEADER_INTS * (1 + slot)
        if sizes:
            if len(sizes) > MAX_SIZES:
                raise ValueError(f"shared-memory send: more than {MAX_SIZES} dynamic dimensions in one message")
            views = self._views(slot, [(t.shape, t.dtype) for t in tensors])  # this message's sizes
            if (sum(_aligned(_nbytes(t.shape, t.dtype)) for t in tensors)) > self.slot_bytes:
                raise ValueError(f"shared-memory send: boundary {boundary} message is larger than its largest "
                                 "declared size (Task.dynamic_dims)")
            for k, (i, d) in enumerate(sizes):
                ints[w + NSIZES + 1 + 2 * k], ints[w + NSIZES + 2 + 2 * k] = (i << 8) | d, tensors[i].shape[d]
        else:
            views = self._message_views(slot, boundary, is_grad, [(t.shape, t.dtype) for t in tensors])
        if len(views) != len(tensors) or any(v.shape != t.shape or v.dtype != t.dtype for v, t in zip(views, tensors)):
            raise ValueError(f"shared-memory send: boundary {boundary} message does not match its spec")
        for v, t in zip(views, tensors):
            v.copy_(t.detach())
        ints[w + NSIZES] = len(sizes) if sizes else 0
        ints[w + MB], ints[w + BOUNDARY], ints[w + IS_GRAD] = mb, boundary, int(is_grad)
        ints[w + STATE] = FULL  # after the data and header: x86 keeps stores in order
        ints[POSTED] = (ints[POSTED] + 1) & 0x7FFFFFFF
        futex_wake(self.base + POSTED * 4)

    def _free_slot(self) -> int | None:
        ints, n = self.ints, self.slots
        for k in range(n):
            slot = (self.next_slot + k) % n
            if ints[HEADER_INTS * (1 + slot) + STATE] == FREE:
                self.next_slot = (slot + 1) % n
                return slot
        return None

    # ---- receiver side ------------------------------------------------------------------------
    def drain(self, shapes_of) -> int:
        """Copy every full slot into the stash and free it; ``shapes_of(boundary, is_grad)`` gives
        a message's (shape, dtype) list. Returns how many slots were freed."""
        ints, freed = self.ints, 0
        for slot in range(self.slots):
            w = HEADER_INTS * (1 + slot)
            if ints[w + STATE] != FULL:
                continue
            key = (ints[w + BOUNDARY], ints[w + MB], bool(ints[w + IS_GRAD]))
            if key in self.stash:
                raise RuntimeError(f"shared-memory receive from rank {self.peer}: message {key} arrived twice")
            n = ints[w + NSIZES]
            if n:  # a message with dynamic dimensions: its own shapes, views made for it alone
                shapes = [[list(shape), dtype] for shape, dtype in shapes_of(key[0], key[2])]
                for k in range(n):
                    code, size = ints[w + NSIZES + 1 + 2 * k], ints[w + NSIZES + 2 + 2 * k]
                    shapes[code >> 8][0][code & 0xFF] = size
                views = self._views(slot, [(tuple(shape), dtype) for shape, dtype in shapes])
            else:
                views = self._message_views(slot, key[0], key[2], shapes_of(key[0], key[2]))
            self.stash[key] = [v.clone() for v in views]
            ints[w + STATE] = FREE
            freed += 1
        if freed:
            ints[FREED] = (ints[FREED] + freed) & 0x7FFFFFFF
            futex_wake(self.base + FREED * 4)
        return freed

    def take(self, boundary: int, mb: int, is_grad: bool, shapes_of) -> list[torch.Tensor]:
        """The message for exactly (boundary, mb, direction), waiting for it without spinning."""
        key = (boundary, mb, is_grad)
        deadline = None
        while True:
            got = self.stash.pop(key, None)
            if got is not None:
                return got
            seen = self.ints[POSTED]
            self.drain(shapes_of)
            if key in self.stash:
                continue
            deadline = deadline or time.monotonic() + self.timeout_s
            if time.monotonic() > deadline:
                raise TimeoutError(f"shared-memory receive from rank {self.peer}: no message {key} "
                                   f"for {self.timeout_s:.0f} s")
            futex_wait(self.base + POSTED * 4, seen)

    def close(self) -> None:
        self._view_cache.clear()
        self.ints.release()
        del self.bytes
        try:
            self.mm.close()
        except BufferError:  # a tensor still views the mapping; the process exit unmaps it
            pass
