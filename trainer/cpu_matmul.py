"""Which library computes float32 matrix products on the CPU: PyTorch's BLAS (MKL) or oneDNN.

Why: PyTorch's CPU ``mm``/``addmm`` call MKL, and MKL takes a slower code path on AMD processors
than on Intel's. On this project's machines (AMD EPYC, Zen 5, AVX-512; one thread) a
``Linear(1024, 1024)`` forward on 64 rows ran at 102 GFLOP/s through MKL and 214 through oneDNN
(which PyTorch ships, and which picks its kernels by instruction set, not by vendor); the weight
gradient over 512 rows took 11.2 ms against 5.6 ms; a training step of the benchmark mlp (depth 8,
width 1024, batch 512) went from 2,020 to 3,982 samples/s.

How: ``use("onednn")`` registers CPU kernels for ``aten::mm`` and ``aten::addmm`` (through
``torch.library``) that hand 2-D float32 operands, each laid out by rows or by columns, to oneDNN's
matmul primitive (``mkldnn::_linear_pointwise``, the op PyTorch's own compiler emits for linear
layers). Autograd is untouched: its formulas call ``mm``, so forwards, input gradients and weight
gradients all take the faster kernel, and the runtime's split backward (BI/W) skips exactly what
it skipped before. Any other case (another dtype, ``alpha``/``beta`` other than 1, a matrix added
in ``addmm``, other strides, an empty operand) goes to the batched BLAS kernels (``bmm``,
``baddbmm``), which are not overridden, so results there are PyTorch's own. The setting is
process-wide and forked children inherit it; ``use("default")`` removes the kernels.

Results differ from MKL's in the last bits (another summation order), as MKL's own differ between
matrix shapes; training is otherwise the same computation.
"""

from __future__ import annotations

import os
import warnings

import torch

BACKENDS = ("default", "onednn")
ENV = "PIPEBOARD_CPU_MATMUL"

_library: torch.library.Library | None = None
calls = 0  # products oneDNN computed in this process since the kernels were registered (tests read it)


def available() -> bool:
    """Whether this PyTorch build has the oneDNN kernel ``use("onednn")`` calls."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def configured(value: str | None = None) -> str:
    """``value``, else ``$PIPEBOARD_CPU_MATMUL``, else "default"; ValueError names a bad one."""
    backend = value or os.environ.get(ENV) or "default"
    if backend not in BACKENDS:
        source = "cpu_matmul" if value else ENV
        raise ValueError(f"{source}: must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend


def active() -> str:
    """The backend this process computes float32 CPU matrix products with now."""
    return "onednn" if _library is not None else "default"


def use(backend: str) -> None:
    """Compute this process's float32 CPU matrix products with ``backend`` from now on."""
    global _library, calls
    backend = configured(backend)
    if backend == active():
        return
    if backend == "default":
        assert _library is not None
        _library._destroy()
        _library = None
        return
    if not available():
        raise RuntimeError("cpu_matmul onednn: this PyTorch build has no oneDNN (mkldnn) linear kernel")
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        # "Overriding a previously registered kernel": that is the point
        warnings.simplefilter("ignore", UserWarning)
        library.impl("mm", _mm, "CPU")
        library.impl("addmm", _addmm, "CPU")
    _library = library
    calls = 0


def _by_rows_or_columns(t: torch.Tensor) -> bool:
    rows, cols = t.shape
    return t.stride() == (cols, 1) or t.stride() == (1, rows)


def _onednn_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype is torch.float32 and b.dtype is torch.float32 and a.dim() == 2 and b.dim() == 2
            and a.shape[1] == b.shape[0] and a.numel() > 0 and b.numel() > 0
            and _by_rows_or_columns(a) and _by_rows_or_columns(b))


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    global calls
    if _onednn_ok(a, b):
        calls += 1
        # x @ w^T with w = b^T: oneDNN reads the transposed view in place, no copy
        return torch.ops.mkldnn._linear_pointwise(a, b.t(), None, "none", [], "")
    _check_shapes(a, b)
    return torch.bmm(a.unsqueeze(0), b.unsqueeze(0)).squeeze(0)


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    global calls
    if (beta == 1 and alpha == 1 and bias.dim() == 1 and bias.dtype is torch.float32 and _onednn_ok(a, b)
            and bias.shape[0] == b.shape[1] and bias.stride() == (1,)):
        calls += 1
        return torch.ops.mkldnn._linear_pointwise(a, b.t(), bias, "none", [], "")
    _check_shapes(a, b)
    return torch.baddbmm(bias.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), beta=beta, alpha=alpha).squeeze(0)


def _check_shapes(a: torch.Tensor, b: torch.Tensor) -> None:
    """PyTorch's own message for the commonest user error (a layer fed the wrong width), which
    the batched fallback would word differently."""
    if a.dim() != 2 or b.dim() != 2:
        raise RuntimeError("self must be a matrix" if a.dim() != 2 else "mat2 must be a matrix")
    if a.shape[1] != b.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied "
                           f"({a.shape[0]}x{a.shape[1]} and {b.shape[0]}x{b.shape[1]})")
