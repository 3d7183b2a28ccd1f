"""Single-process references for the runtime's semantics (tests and benchmarks compare to these).

- ``train_sync``: plain training with gradient accumulation over the microbatches of each batch,
  which is exactly what ``gpipe``, ``1f1b`` and ``dp`` must compute.
- ``emulate_async``: the asynchronous ``pipedream`` schedule executed in one process with weight
  stashing done the obvious, expensive way (a deep copy of the stage per weight version); the
  runtime's storage-level versions must reproduce it. A stage's replicas share one model (they
  always hold the same version): each ``ALLREDUCE`` waits for the whole group, and the first
  replica's ``STEP`` applies the sum of every backward since the last one. ``stash=False`` runs
  every backward against the latest weights instead (recomputing its forward), the semantics
  weight stashing exists to avoid.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch

from pipeboard.trainer.precision import autocast
from pipeboard.trainer.runtime import stage_modules
from pipeboard.trainer.runtime.run_config import RunConfig
from pipeboard.trainer.runtime.data import TrainStream
from pipeboard.trainer.runtime.layout import resolve
from pipeboard.trainer.schedule.actions import Kind


def _forward(model, x):
    return model(*x) if isinstance(x, (tuple, list)) else model(x)


def train_sync(cfg: RunConfig, steps: int) -> torch.nn.Module:
    """``steps`` optimizer steps over batches of ``cfg.batch_size``, each the sum of its
    ``cfg.microbatches`` microbatch gradients of loss / M, forwards in ``cfg.precision``.
    Returns the trained model."""
    task = stage_modules.load_task(cfg)
    model, opt = task.model, task.make_optimizer(task.model.parameters(), cfg.lr)
    stream = TrainStream(task, cfg.batch_size, cfg.microbatches, torch.device("cpu"))
    M = cfg.microbatches
    for k in range(steps):
        for j in range(M):
            x, y = stream.microbatch(k * M + j)
            with autocast("cpu", cfg.precision):
                loss = task.loss(_forward(model, x), y) / M
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model


def emulate_async(cfg: RunConfig, steps: int, stash: bool = True) -> torch.nn.Module:
    """Run the pipedream action lists for ``steps`` batches in one process: one update per batch,
    each microbatch's loss scaled by 1/M (a batch's gradient is the mean over its samples)."""
    layout = resolve(cfg)
    task = stage_modules.load_task(cfg)
    example = task.example_input(cfg.microbatch_size)
    stages = stage_modules.build_stages(task.model, example,
                                        stage_modules.stage_layers(cfg, task, layout.virtual_stages),
                                        task.layers, task.varying_dims(cfg.microbatch_size))
    S, M = len(stages), cfg.microbatches
    scale = 1.0 / M
    opts = [task.make_optimizer(m.parameters(), cfg.lr) for m in stages]
    versions = [{0: copy.deepcopy(m)} for m in stages]
    pending = [None] * S  # summed gradients since the last step, per stage
    stream = TrainStream(task, cfg.batch_size, M, torch.device("cpu"))
    # full backwards: the same gradients the runtime's batched weight-gradient passes must give
    schedule = replace(layout, batch_weight_grads=False).build(steps * M)
    acts, grads, ctx = {}, {}, {}
    arrived: dict[tuple[int, int], set[int]] = {}  # (stage, version) -> ranks at that ALLREDUCE
    applied: set[tuple[int, int]] = set()  # (stage, version) of updates already made
    pos = [0] * len(schedule.actions)

    def run(w: int, a) -> bool:
        s, mb = a.stage, a.microbatch
        if a.kind is Kind.FORWARD:
            if s > 0 and (s, mb) not in acts:
                return False
            x, y = stream.microbatch(mb)
            inputs = (list(x) if isinstance(x, (tuple, list)) else [x]) if s == 0 else [t.detach().requires_grad_(t.dtype.is_floating_point) for t in acts.pop((s, mb))]
            module = versions[s][a.version] if stash else stages[s]
            out = module(*inputs)
            if s == S - 1:
                ctx[(s, mb)] = (inputs, task.loss(out[0], y) * scale, module)
            else:
                ctx[(s, mb)] = (inputs, out, module)
                acts[(s + 1, mb)] = out
        elif a.kind is Kind.BACKWARD:
            if s < S - 1 and (s, mb) not in grads:
                return False
            inputs, out, module = ctx.pop((s, mb))
            if not stash:  # the backward sees the latest weights: recompute against them
                inputs = [t.detach().requires_grad_(t.dtype.is_floating_point) for t in inputs]
                out = module(*inputs)
                if s == S - 1:
                    out = task.loss(out[0], stream.microbatch(mb)[1]) * scale
            if s == S - 1:
                out.backward()
            else:
                g = grads.pop((s, mb))
                # gradients come for the floating-point outputs only (an attention mask crosses too)
                pairs = [(o, gg) for o, gg in zip([o for o in out if o.dtype.is_floating_point], g) if o.requires_grad]
                torch.autograd.backward([o for o, _ in pairs], [gg for _, gg in pairs])
            if s > 0:
                grads[(s - 1, mb)] = [t.grad for t in inputs if t.dtype.is_floating_point]
            new = [p.grad.clone() for p in module.parameters()]
            module.zero_grad(set_to_none=True)
            pending[s] = new if pending[s] is None else [a + b for a, b in zip(pending[s], new)]
        elif a.kind is Kind.ALLREDUCE:  # a barrier: the update needs every replica's backwards
            here = arrived.setdefault((s, a.version), set())
            here.add(w)
            return len(here) == len(a.group)
        elif a.kind is Kind.STEP:
            if (s, a.version) in applied:
                return True  # another replica of this stage already made this update
            applied.add((s, a.version))
            for p, g in zip(stages[s].parameters(), pending[s]):
                p.grad = g
            opts[s].step()
            opts[s].zero_grad(set_to_none=True)
            pending[s] = None
            if stash:
                versions[s][a.version] = copy.deepcopy(stages[s])
        return True

    while any(pos[w] < len(acts_w) for w, acts_w in enumerate(schedule.actions)):
        progressed = False
        for w, acts_w in enumerate(schedule.actions):
            while pos[w] < len(acts_w) and run(w, acts_w[pos[w]]):
                pos[w] += 1
                progressed = True
        if not progressed:
            raise RuntimeError("emulate_async: the schedule cannot make progress")
    return task.model
