"""Which library computes float32 matrix products on the CPU: PyTorch's BLAS (MKL) or oneDNN.

Why: PyTorch's CPU ``mm``/``addmm`` call MKL, and MKL takes a slower code path on some AMD
processors than on Intel's; oneDNN (which PyTorch ships) picks its kernels by instruction set, not
by vendor. How much that buys depends on the processor (much on some AMD processors, almost
nothing on others): ``bench/matmul.py`` measures it on the machine at hand, and docs/runtime.md,
"CPU matrix products", records what it measured, with date and processor.

How: ``use("onednn")`` registers CPU kernels for ``aten::mm``, ``aten::addmm`` and
``aten::addmm_`` (through ``torch.library``) that hand 2-D float32 operands, each laid out by rows
or by columns, to oneDNN's matmul primitive (``mkldnn::_linear_pointwise``, the op PyTorch's own
compiler emits for linear layers). Autograd is untouched: its formulas call ``mm``, so a Linear
layer's forward, input gradient and weight gradient all take the faster kernel, as do the
runtime's batched weight gradients (``mm``, ``addmm_``), and the split backward (BI/W) skips
exactly what it skipped before. Any other case (another dtype, ``alpha``/``beta`` other than 1, a
matrix added in ``addmm``, other strides, an empty operand) goes to PyTorch's own kernel through
the ``out=`` overloads, which are not overridden: same results, same error messages. Products that
reach neither op (``mm``'s and ``addmm``'s ``out=`` forms, ``bmm``, ``einsum`` over batches) keep
PyTorch's kernels. The setting is process-wide and forked children inherit it; ``use("default")``
removes the kernels.

Cost: the kernels are Python functions, so every CPU ``mm``/``addmm`` call of any dtype pays a
Python call on top of the product (figures in docs/runtime.md, "CPU matrix products"); that is
nothing beside a wide layer's product but noticeable for models of tiny layers, which should keep
the default. Results differ from MKL's in the last bits (another summation order), as MKL's own
differ between matrix shapes.

Importing this module does not import torch (the service reads ``configured()``).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

BACKENDS = ("default", "onednn")
ENV = "PIPEBOARD_CPU_MATMUL"

_library: Any = None  # the torch.library.Library holding the kernels, while registered
calls = 0  # products oneDNN computed in this process since the kernels were registered
torch: Any = None  # bound by use() (the kernels run on every matrix product: no import there)


def configured(value: str | None = None) -> str:
    """``value``, else ``$PIPEBOARD_CPU_MATMUL``, else "default"; ValueError names a bad one."""
    backend = value or os.environ.get(ENV) or "default"
    if backend not in BACKENDS:
        source = "cpu_matmul" if value else ENV
        raise ValueError(f"{source}: must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend


def available() -> bool:
    """Whether this PyTorch build has the oneDNN kernel ``use("onednn")`` calls."""
    import torch as t

    return t.backends.mkldnn.is_available() and hasattr(t.ops.mkldnn, "_linear_pointwise")


def active() -> str:
    """The backend this process computes float32 CPU matrix products with now."""
    return "onednn" if _library is not None else "default"


def use(backend: str | None) -> None:
    """Compute this process's float32 CPU matrix products with ``backend`` (None: ``configured()``)
    from now on."""
    global _library, calls, torch
    backend = configured(backend)
    if backend == active():
        return
    if backend == "default":
        _library._destroy()
        _library = None
        return
    if not available():
        raise RuntimeError("onednn needs a PyTorch build with oneDNN (mkldnn); this one has none")
    import torch as t

    torch = t
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        # "Overriding a previously registered kernel": that is the point
        warnings.simplefilter("ignore", UserWarning)
        library.impl("mm", _mm, "CPU")
        library.impl("addmm", _addmm, "CPU")
        library.impl("addmm_", _addmm_, "CPU")
    _library = library
    calls = 0


def use_with_children(backend: str | None) -> str:
    """``use(backend)`` in this process and ``$PIPEBOARD_CPU_MATMUL`` set to it for the processes
    it starts (forked ones inherit the kernels; spawned ones and ``run_training``'s launcher read
    the variable); returns the backend."""
    backend = configured(backend)
    os.environ[ENV] = backend
    use(backend)
    return backend


def _by_rows_or_columns(t) -> bool:
    rows, cols = t.shape
    return t.stride() == (cols, 1) or t.stride() == (1, rows)


def _onednn_ok(a, b) -> bool:
    return (a.dtype is torch.float32 and b.dtype is torch.float32 and a.dim() == 2 and b.dim() == 2
            and a.shape[1] == b.shape[0] and a.numel() > 0 and b.numel() > 0
            and _by_rows_or_columns(a) and _by_rows_or_columns(b))


def _bias_ok(bias, b, beta, alpha) -> bool:
    return (beta == 1 and alpha == 1 and bias.dtype is torch.float32 and bias.dim() == 1
            and bias.shape[0] == b.shape[1] and bias.stride() == (1,))


def _linear(a, b, bias):
    """``a @ b + bias`` by oneDNN: its linear computes x @ w^T, and w = b^T is read in place."""
    global calls
    calls += 1
    return torch.ops.mkldnn._linear_pointwise(a, b.t(), bias, "none", [], "")


def _mm(a, b):
    if _onednn_ok(a, b):
        return _linear(a, b, None)
    return torch.ops.aten.mm.out(a, b, out=a.new_empty(0))  # PyTorch's own kernel


def _addmm(bias, a, b, *, beta=1, alpha=1):
    if _onednn_ok(a, b) and _bias_ok(bias, b, beta, alpha):
        return _linear(a, b, bias)
    return torch.ops.aten.addmm.out(bias, a, b, beta=beta, alpha=alpha, out=a.new_empty(0))


def _addmm_(acc, a, b, *, beta=1, alpha=1):
    """``acc += a @ b`` (a weight gradient accumulating over microbatches)."""
    if (beta == 1 and alpha == 1 and acc.dtype is torch.float32 and acc.dim() == 2 and _onednn_ok(a, b)
            and acc.shape == (a.shape[0], b.shape[1])):
        return acc.add_(_linear(a, b, None))
    return torch.ops.aten.addmm.out(acc, a, b, beta=beta, alpha=alpha, out=acc)
