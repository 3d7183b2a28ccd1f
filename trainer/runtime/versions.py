"""Weight versions of one stage: weight stashing without ever swapping weights in place.

PipeDream's own runtime broke on PyTorch >= 1.5 because it copied stashed weights back into the
parameters in place, under tensors that autograd had saved for a pending backward. Here every
version is its own set of tensors: a forward runs against the leaf tensors of the version it was
given (swapped into the module's parameter slots for that call, see ``Stage._call_with``), its
autograd graph keeps exactly those, and the matching backward therefore uses the weights its
forward used.

The optimizer (any ``torch.optim`` optimizer, so its state dict checkpoints as usual) owns the
module's ``nn.Parameter`` objects. A step normally updates them in place. When the version they
hold is still needed (a stashed forward not yet backpropagated, or a later forward that vertical
sync pins to it), the parameters are first moved to fresh storage, so the old version's tensors
stay untouched; that storage returns to a pool when its version is released.

Synchronous schedules never have two versions alive, so they take the plain path: forward through
the module's own parameters, step in place, no copies.
"""

from __future__ import annotations

import torch
from torch import nn


class WeightVersions:
    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, stash: bool) -> None:
        self.module = module
        self.optimizer = optimizer
        self.stash = stash
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.current = 0
        self.views: dict[int, list[torch.Tensor]] = {}
        self.pool: list[list[torch.Tensor]] = []
        if stash:
            self.views[0] = self._view()

    # -- versions -------------------------------------------------------------------------

    def _view(self) -> list[torch.Tensor]:
        # `.data` gives a tensor on the same storage with its own version counter and no history:
        # a fresh leaf for this version's forwards to accumulate gradients into.
        return [p.data.requires_grad_(True) for p in self.params]

    def reset(self, version: int = 0) -> None:
        """Start a new schedule (segment) whose version numbers begin at ``version``."""
        self.current = version
        if self.stash:
            self.views = {version: self._view()}

    def tensors(self, version: int) -> list[torch.Tensor] | None:
        """The tensors (in ``self.names`` order) a forward of ``version`` runs against; None:
        the module's own parameters (no stashing)."""
        if not self.stash:
            return None
        try:
            return self.views[version]
        except KeyError:
            raise RuntimeError(
                f"weight version {version} is not available (have {sorted(self.views)}): "
                "the schedule asks for a version this stage has released or not produced yet"
            ) from None

    def weights(self, version: int) -> dict[str, torch.Tensor] | None:
        """``tensors(version)`` by parameter name (for ``torch.func.functional_call``)."""
        tensors = self.tensors(version)
        return None if tensors is None else dict(zip(self.names, tensors))

    def release(self, version: int) -> None:
        """No later action uses ``version``: recycle its storage unless the parameters hold it."""
        view = self.views.get(version)
        if view is None or version == self.current:
            return
        self.move_grads(view)  # its last backward's gradients still await the next step
        del self.views[version]
        if view and view[0].data_ptr() != self.params[0].data_ptr():
            self.pool.append([t.detach() for t in view])

    # -- gradients and updates --------------------------------------------------------------

    def gather_grads(self) -> list[torch.Tensor | None]:
        """Move the gradients that backwards left on version tensors onto the parameters."""
        if self.stash:
            for view in self.views.values():
                self.move_grads(view)
        return [p.grad for p in self.params]

    def move_grads(self, view: list[torch.Tensor]) -> None:
        """Add the gradients accumulated on a version's tensors to the parameters' (and clear them)."""
        for p, t in zip(self.params, view):
            if t.grad is not None:
                p.grad = t.grad if p.grad is None else p.grad.add_(t.grad)
                t.grad = None

    def step(self, version: int, keep_current: bool) -> None:
        """Apply the optimizer, producing ``version``. ``keep_current``: the version held now is
        still needed later, so it must survive the update unchanged."""
        self.gather_grads()
        if self.stash and keep_current and self.params:
            fresh = self.pool.pop() if self.pool else [torch.empty_like(p) for p in self.params]
            if not sgd_out_of_place(self.optimizer, self.params, fresh):
                with torch.no_grad():
                    torch._foreach_copy_(fresh, [p.data for p in self.params])
                for p, t in zip(self.params, fresh):
                    p.data = t
                self.optimizer.step()
        else:
            self.optimizer.step()
        for p in self.params:  # not Optimizer.zero_grad: slow Python per call (docs/runtime.md)
            p.grad = None
        old = self.current
        self.current = version
        if self.stash:
            if not keep_current:  # the old version was updated in place: nothing may use it now
                self.views.pop(old, None)
            self.views[version] = self._view()


@torch.no_grad()
def sgd_out_of_place(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], out: list[torch.Tensor]) -> bool:
    """For plain ``torch.optim.SGD``: write the updated weights into ``out`` and point the
    parameters there, leaving the old storage untouched, in one pass (no copy, then update).
    The same update as ``torch.optim.SGD``'s single-tensor step (the momentum buffer is updated
    in one pass, which can round differently in the last bit) and the same optimizer state
    (``momentum_buffer``), so checkpoints stay interchangeable. Returns False
    (nothing done) for any other optimizer or option it does not reproduce."""
    if type(optimizer) is not torch.optim.SGD:
        return False
    groups = optimizer.param_groups
    if any(g.get("differentiable") or isinstance(g["lr"], torch.Tensor) for g in groups):
        return False
    dest = {id(p): t for p, t in zip(params, out)}
    for group in groups:
        lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
        for p in group["params"]:
            t = dest[id(p)]
            if p.grad is None:
                t.copy_(p.data)
                p.data = t
                continue
            grad = p.grad if not group["maximize"] else -p.grad
            if wd != 0:
                grad = grad.add(p.data, alpha=wd)
            if momentum != 0:
                state = optimizer.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = grad.detach().clone()
                elif group["dampening"] == 0:
                    torch.add(grad, buf, alpha=momentum, out=buf)  # one pass instead of mul_ + add_
                else:
                    buf.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
                grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
            torch.add(p.data, grad, alpha=-lr, out=t)
            p.data = t
    return True
