"""A CPU worker's memory, counted in bytes of tensors: what a stage holds, not what the process holds.

The process's resident memory holds the interpreter, torch's libraries and whatever the heap
keeps after a free, so on CPU it cannot judge a prediction of the tensors' bytes. Here each
worker counts, per storage once:
- static: every storage of its stages' parameters, the weight versions it stashes (and the
  recycled ones it keeps for reuse), the gradients on them, and the optimizer's state tensors;
- saved for backward: every tensor autograd packs during a stage's forward
  (``torch.autograd.graph.saved_tensors_hooks``), counted while the graph keeps it (the packed
  handle's lifetime), trainable leaves left out (weights and received inputs are counted above
  or below);
- in flight: what the stage itself keeps per microbatch between forward and backward (inputs,
  outputs, the layer inputs its weight-gradient notes hold; after a split backward's BI the
  output gradients its W reads), which is where a received input lives; a received output
  gradient is counted while its backward runs (and, where W reads it, until then);
- rebuilt: under recompute, what the backward's replay saves again, from the replay until that
  backward ends.
``take`` gives the peak of their sum since the last ``take`` (sampled at every change).
Recompute's replay saves into torch.utils.checkpoint's own hook; ``rebuilding`` stacks a
counting hook on top of it that hands every tensor on to it unchanged.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager

import torch


def storage_key(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


class _Held:
    """A saved tensor while autograd keeps it: counted from pack until the graph drops it."""

    __slots__ = ("t", "counter", "key")

    def __init__(self, counter: Counter, t: torch.Tensor) -> None:
        # detached: an output saved by its own grad_fn would otherwise hold that node in a cycle
        self.t, self.counter, self.key = t.detach(), counter, storage_key(t)
        counter.acquire(self.key)

    def __del__(self) -> None:
        self.counter.release(self.key)


class Counter:
    def __init__(self) -> None:
        self.stages: weakref.WeakSet = weakref.WeakSet()
        self.refs: dict[tuple[int, int], int] = {}  # storage -> holders
        self.level = 0  # bytes of saved and in-flight storages
        self.static = 0  # weights, versions, gradients, optimizer state (at the last refresh)
        self.transient = 0  # recompute's rebuilt tensors inside one backward
        self.peak = 0
        self.weights: set[int] = set()  # storages of weights and versions: static, never saved bytes

    # -- storages held per microbatch -------------------------------------------------------

    def acquire(self, key: tuple[int, int]) -> None:
        n = self.refs.get(key, 0)
        self.refs[key] = n + 1
        if n == 0:
            self.level += key[1]
            self.note()

    def release(self, key: tuple[int, int]) -> None:
        n = self.refs.get(key, 0)
        if n <= 1:
            if self.refs.pop(key, None) is not None:
                self.level -= key[1]
        else:
            self.refs[key] = n - 1

    def hold(self, tensors) -> list[tuple[int, int]]:
        keys = [storage_key(t) for t in tensors if isinstance(t, torch.Tensor)]
        for k in keys:
            self.acquire(k)
        return keys

    def drop(self, keys: list[tuple[int, int]]) -> None:
        for k in keys:
            self.release(k)

    # -- autograd's saved tensors -------------------------------------------------------------

    def _pack(self, t: torch.Tensor):
        # a weight or a view of one (static), a received input (in flight)
        if (t.is_leaf and t.requires_grad) or t.untyped_storage().data_ptr() in self.weights:
            return t
        return _Held(self, t)

    @staticmethod
    def _unpack(h):
        return h.t if type(h) is _Held else h

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    @contextmanager
    def rebuilding(self):
        """Inside recompute's replay: count what it saves (each storage once), pass it on."""
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if top is None:  # not inside a replay (a forward without autograd's hooks)
            yield
            return
        outer_pack, outer_unpack = top
        seen: set[tuple[int, int]] = set()

        def pack(t):
            key = storage_key(t)
            if key not in seen and key not in self.refs and key[0] not in self.weights \
                    and not (t.is_leaf and t.requires_grad):
                seen.add(key)
                self.transient += key[1]
                self.note()
            return outer_pack(t)

        with torch.autograd.graph.saved_tensors_hooks(pack, outer_unpack):
            yield

    def end_backward(self) -> None:
        self.note()
        self.transient = 0

    # -- static -------------------------------------------------------------------------------

    def refresh(self) -> int:
        """Recount the static part; returns the gradients' bytes within it."""
        seen: set[int] = set()
        total = grads = 0

        def add(t) -> int:
            if not isinstance(t, torch.Tensor):
                return 0
            s = t.untyped_storage()
            p = s.data_ptr()
            if p in seen or s.nbytes() == 0:
                return 0
            seen.add(p)
            return s.nbytes()

        for st in list(self.stages):
            v = st.versions
            tensor_lists = [v.params, *v.views.values(), *v.pool]
            for ts in tensor_lists:
                for t in ts:
                    total += add(t)
        self.weights = set(seen)
        for st in list(self.stages):
            v = st.versions
            tensor_lists = [v.params, *v.views.values(), *v.pool]
            for ts in tensor_lists:
                for t in ts:
                    g = add(t.grad)
                    grads += g
                    total += g
            for state in v.optimizer.state.values():
                for t in state.values():
                    total += add(t)
        self.static = total
        self.note()
        return grads

    def note(self, extra: int = 0) -> None:
        v = self.static + self.level + self.transient + extra
        if v > self.peak:
            self.peak = v

    def take(self) -> int:
        """Peak counted bytes since the last take; the next period starts from the level now."""
        self.refresh()
        peak = self.peak
        self.peak = self.static + self.level + self.transient
        return peak


_local = threading.local()


def counter() -> Counter:
    """The calling thread's counter. A worker builds its stages and takes its meter on one thread; a
    counter shared across threads (tests run workers as threads of one process) would read one
    worker's tensors while another swaps their storages."""
    c = getattr(_local, "counter", None)
    if c is None:
        c = _local.counter = Counter()
    return c
