"""Capture a whole model as one graph of ATen ops with ``torch.export`` (non-strict).

Why torch.export and not torch.fx: fx traces with proxies, so any Python branch on a tensor's
value, shape or a config (transformers' forwards are full of them, and a widely copied GPT file
asserts on its input's length) stops the trace. Non-strict export runs the model's own Python on
fake tensors with concrete shapes, so such branches simply take the example's path, and every
node it records carries ``nn_module_stack``: the module paths it ran under. That is what
:mod:`granularity` groups into layers and :mod:`outline` turns into one GraphModule per layer.

Shapes are the example's, except the *dynamic* dimensions a caller names (``dynamic``: input
dimension -> largest size or None, e.g. ``{1: 512}`` for text padded per batch to its own longest
sequence): each is exported as ``torch.export.Dim.DYNAMIC``, so the captured ``view(B, T, C)``
reads ``T`` off its input at run time and one capture serves every length (no re-capture per
shape). The batch dimension stays static: a run's microbatch size is fixed. A dimension the
model's own code pins to the example's size (``assert x.shape[1] == 64``) is an
:class:`UntraceableModelError` naming it rather than a graph that silently fails on other lengths.

The captured graph is the unlifted program (``ExportedProgram.module()``): parameters and buffers
are the model's own tensor objects, read by ``get_attr`` (a tied parameter is one object under
two names), and buffer updates (BatchNorm's running statistics) are in-place ops on them, as in
the model itself.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import traceback
from typing import Any

import torch
from torch import fx, nn

from pipeboard.trainer.profile.schema import CAPTURE_VERSION

__all__ = ["CAPTURE_VERSION", "UntraceableModelError", "as_tuple", "capture"]


class UntraceableModelError(ValueError):
    """The model cannot be captured or grouped; the message is one line naming what and where."""


def as_tuple(example_input: Any) -> tuple:
    return tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,)


def _user_frame(exc: BaseException) -> tuple[str, int, str] | None:
    """(file, line, code) of the innermost traceback frame outside torch: the user's (or
    transformers') line that the capture stopped at."""
    torch_dir = os.path.dirname(torch.__file__)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(torch_dir)
              and not f.filename.startswith(os.path.dirname(__file__))]
    if not frames:
        return None
    f = frames[-1]
    return os.path.basename(f.filename), f.lineno or 0, (f.line or "").strip()


def _first_line(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


class _ModuleTracker:
    """Forward pre/post hooks on every submodule keep the stack of module paths running, so a
    failed capture can name the module it failed in (the innermost one still open)."""

    def __init__(self, model: nn.Module):
        self.stack: list[str] = []
        self.handles = []
        for path, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._enter(path)))
            self.handles.append(module.register_forward_hook(self._leave(path)))

    def _enter(self, path: str):
        def hook(module, args):
            self.stack.append(path)
        return hook

    def _leave(self, path: str):
        # not called when forward raises: the stack then still ends at the failing module
        def hook(module, args, output):
            if self.stack and self.stack[-1] == path:
                self.stack.pop()
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _failure(model: nn.Module, exc: BaseException, module_path: str | None) -> UntraceableModelError:
    where = _user_frame(exc)
    place = ""
    if module_path is not None:
        place = f" in module {module_path or '(the model itself)'!r} ({type(model.get_submodule(module_path)).__name__})"
    at = f" at {where[0]}:{where[1]}: `{where[2]}`" if where else ""
    return UntraceableModelError(f"cannot capture {type(model).__name__} with torch.export{place}{at}: "
                                 f"{_first_line(exc)}")


def dynamic_shapes(inputs: tuple, dynamic: dict[int, int | None] | None):
    """torch.export's ``dynamic_shapes`` for ``inputs``: each named dimension, in every input that
    has it (an attention mask and its token ids share the sequence dimension), is dynamic."""
    if not dynamic:
        return None
    return tuple({d: torch.export.Dim.DYNAMIC for d in dynamic if 0 < d < t.dim()} or None for t in inputs)


def _check_dynamic(gm: fx.GraphModule, inputs: tuple, dynamic: dict[int, int | None] | None) -> None:
    """Every named dynamic dimension stayed symbolic (the model did not pin it to the example's size)."""
    if not dynamic:
        return
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (node, t) in enumerate(zip(placeholders, inputs)):
        shape = getattr(node.meta.get("val"), "shape", None)
        if shape is None:
            continue
        for d in dynamic:
            if 0 < d < t.dim() and isinstance(shape[d], int):
                raise UntraceableModelError(f"input {i} ({node.name}): dimension {d} cannot vary: the model's code fixes "
                                            f"it to the example's size {shape[d]} (so every batch must have it)")


def capture(model: nn.Module, example_input: Any, dynamic: dict[int, int | None] | None = None) -> fx.GraphModule:
    """The whole of ``model`` run on ``example_input`` (a tensor or a tuple of tensors; forward
    parameters beyond them keep their defaults) as one GraphModule of ATen ops whose
    parameters and buffers are ``model``'s own. ``dynamic``: the input dimensions whose size varies
    (see the module docstring). Raises :class:`UntraceableModelError`."""
    inputs = as_tuple(example_input)
    for i, value in enumerate(inputs):
        if not isinstance(value, torch.Tensor):
            raise UntraceableModelError(f"example input {i} must be a tensor, got {type(value).__name__}")
    try:
        inspect.signature(model.forward).bind(*inputs)
    except TypeError as exc:
        raise UntraceableModelError(f"{type(model).__name__}.forward does not take the example's {len(inputs)} "
                                    f"input(s): {exc}") from None
    except ValueError:  # no signature to check (a builtin): export says what goes wrong
        pass
    tracker = _ModuleTracker(model)
    # export logs a failing op's whole graph and fake-tensor traceback as errors, and prints the
    # graph so far on stderr; the failure is reported once, in one line, below
    logging.disable(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            program = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes(inputs, dynamic), strict=False)
    except Exception as exc:  # export raises many kinds (UserError, GuardOnDataDependent, TypeError, ...)
        # the innermost module still open is where the failing op ran; the root's path is ""
        path = tracker.stack[-1] if tracker.stack else None
        raise _failure(model, exc, path) from None
    finally:
        logging.disable(logging.NOTSET)
        tracker.remove()
    gm = program.module()
    _check_dynamic(gm, inputs, dynamic)
    _drop_guards(gm)
    return gm


def _drop_guards(gm: fx.GraphModule) -> None:
    """Remove the input-shape guard call export adds (``_guards_fn``): stages run every
    microbatch at the captured shapes (dynamic dimensions aside, whose range the task's data
    sets), and a guard node is no op of the model's to place in a layer."""
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            gm.graph.erase_node(node)
    for name, _ in list(gm.named_children()):
        if name.startswith("_guards"):
            delattr(gm, name)
    gm.recompile()
