"""Parameters shared by several stages (tied weights), kept as one parameter the way Megatron does.

Why: every worker builds the whole model and keeps its own stages, so a parameter two stages use
(GPT-2's LM head is its token embedding) becomes one copy per worker, each updated with only its
own stage's gradient; training silently drifts away from single-process training, where the
gradients of both uses add up in one parameter. Here, before the update, every copy's gradient
becomes the sum over all stages that use it; copies start equal and take the same optimizer step
from the same state, so they stay bit-identical.

- Which: :func:`find` compares Parameter identity across the stage modules (all built from one
  model), in stage order, so every rank lists the same ties in the same order.
- Replicas: after its replica ALLREDUCE each replica of a stage holds that stage's whole gradient.
  Only replica 0 contributes it (the others add zeros), so each stage counts once, exactly (no
  division by the replica count, which would round), and every member gets the same sum.
- When: all of a rank's tied sums run at its first STEP that needs one. Sync schedules put their
  updates at the very end of a rank's iteration (only STEPs and batched ``W(-1)`` follow the first
  STEP, checked at set-up): by then the rank has posted every transfer of the iteration, so no peer
  waits on it for anything but the sums, and each rank runs the sums group by group in one global
  order, so no two ranks wait on each other in opposite orders (interleaved chunks stepping in
  different orders on different workers included). Any ``W(-1)`` still ahead of a tied stage is
  run first (the schedule's own becomes a no-op).
- One worker holding two stages of a tie (interleaved chunks): the later stage gets its own copy,
  so each stage steps its own copy once with the full sum, like copies on different workers.
- pipedream updates each stage on its own clock, so copies on different workers cannot take one
  update: refused (``check``) before any worker starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from pipeboard.trainer.runtime.run_config import ConfigError
from pipeboard.trainer.schedule.actions import Kind


@dataclass(frozen=True)
class Tied:
    name: str  # the model's name for it (its last alias: the tying use, e.g. the LM head)
    slots: dict[int, tuple[str, ...]]  # stage -> its names inside that stage module

    @property
    def stages(self) -> tuple[int, ...]:
        return tuple(sorted(self.slots))


def find(modules, model: nn.Module | None = None) -> list[Tied]:
    """Every parameter object used by more than one of ``modules``, in stage order."""
    slots: dict[int, dict[int, list[str]]] = {}  # id -> stage -> names
    for s, m in enumerate(modules):
        for n, p in m.named_parameters(remove_duplicate=False):
            if not p.requires_grad:
                continue  # frozen: nothing to keep in step
            slots.setdefault(id(p), {}).setdefault(s, []).append(n)
    names: dict[int, str] = {}
    for n, p in (model.named_parameters(remove_duplicate=False) if model is not None else ()):
        names[id(p)] = n
    return [Tied(names.get(k, by_stage[max(by_stage)][0]), {s: tuple(v) for s, v in by_stage.items()})
            for k, by_stage in slots.items() if len(by_stage) > 1]


def _stage_list(stages) -> str:
    stages = [str(s) for s in stages]
    return stages[0] if len(stages) == 1 else f"{', '.join(stages[:-1])} and {stages[-1]}"


def check(cfg, layout, ties: list[Tied]) -> None:
    """pipedream: a tie across workers is a ConfigError (one update per stage clock cannot keep
    the copies one parameter)."""
    if not cfg.is_async:
        return
    worker_of = {s: r for r in range(layout.world) for s in layout.stages_of(r)}
    for t in ties:
        if len({worker_of[s] for s in t.stages}) > 1:
            raise ConfigError(f"{cfg.schedule}: parameter {t.name!r} is shared by stages {_stage_list(t.stages)} "
                              "(tied weights); untie it (e.g. tie_word_embeddings=False) or use a synchronous schedule")


class TiedGrads:
    """One rank's share of the tied sums. Create on every rank in the same order (it makes the
    process groups), ``localize`` each stage module as it is built, ``attach`` the Stages."""

    def __init__(self, cfg, layout, template, rank: int, ties: list[Tied]) -> None:
        check(cfg, layout, ties)
        holders: dict[int, list[int]] = {}  # stage -> ranks
        for w in template.workers:
            for s in w.stages:
                holders.setdefault(s, []).append(w.rank)
        mine = set(template.workers[rank].stages)
        self.contributes = template.workers[rank].replica == 0
        # one bucket per rank group, in order of first appearance: the same on every rank
        self.buckets: list[tuple[tuple[int, ...], object, list[Tied]]] = []
        by_group: dict[tuple[int, ...], list[Tied]] = {}
        for t in ties:
            ranks = tuple(sorted({r for s in t.stages for r in holders[s]}))
            if ranks not in by_group:
                by_group[ranks] = []
                group = dist.new_group(list(ranks)) if len(ranks) > 1 else None
                self.buckets.append((ranks, group, by_group[ranks]))
            if mine & set(t.stages):
                by_group[ranks].append(t)
        self.buckets = [b for b in self.buckets if b[2]]
        self.local = sorted({s for _, _, ts in self.buckets for t in ts for s in t.stages if s in mine})
        self.stages: dict = {}
        self._owned: dict[int, int] = {}  # id(tie) -> first local stage holding it
        self._done: set[int] = set()
        self.heartbeat = None
        if self.local:
            _check_tail(template.actions[rank], rank)

    def localize(self, stage: int, module: nn.Module) -> nn.Module:
        """A later local stage of a tie gets its own copy (same values), stepped by its own
        optimizer, so no parameter object is stepped by two stages."""
        for _, _, ties in self.buckets:
            for t in ties:
                if stage not in t.slots:
                    continue
                if self._owned.setdefault(id(t), stage) == stage:
                    continue
                old = module.get_parameter(t.slots[stage][0])
                new = nn.Parameter(old.detach().clone(), requires_grad=old.requires_grad)
                for n in t.slots[stage]:
                    owner, _, attr = n.rpartition(".")
                    module.get_submodule(owner)._parameters[attr] = new
        return module

    def attach(self, stages: dict, heartbeat) -> None:
        self.stages, self.heartbeat = stages, heartbeat
        for s in self.local:
            stages[s].before_step = self.before_step

    def before_step(self, stage) -> None:
        if not self._done:
            self.reduce()
        self._done.add(stage.index)
        if self._done.issuperset(self.local):
            self._done = set()

    def _copies(self, t: Tied) -> list[nn.Parameter]:
        return [self.stages[s].module.get_parameter(t.slots[s][0]) for s in t.stages if s in self.stages]

    @torch.no_grad()
    def reduce(self) -> None:
        """Every local copy's gradient := the sum over every stage of the tie."""
        for s in self.local:
            self.stages[s].backward_weight(-1)  # weight gradients still pending (no-op if none)
        for ranks, group, ties in self.buckets:
            sums = []
            for t in ties:
                copies = self._copies(t)
                g = torch.zeros_like(copies[0])
                for c in copies:
                    if c.grad is not None:
                        g += c.grad
                sums.append((copies, g))
            if group is not None:
                flat = torch.cat([g.reshape(-1) for _, g in sums])
                if not self.contributes:
                    flat.zero_()
                self.heartbeat.waiting(True)
                try:
                    dist.all_reduce(flat, group=group)
                finally:
                    self.heartbeat.waiting(False)
                offset = 0
                for _, g in sums:
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    offset += g.numel()
            for copies, g in sums:
                for i, c in enumerate(copies):
                    c.grad = g if i == 0 else g.clone()  # optimizers may change a gradient in place


def _check_tail(actions, rank: int) -> None:
    """The sums wait on peers: only local work (STEPs, batched W) may follow a rank's first STEP."""
    first = next((i for i, a in enumerate(actions) if a.kind is Kind.STEP), len(actions))
    late = [a for a in actions[first:] if not (a.kind is Kind.STEP or (a.kind is Kind.BACKWARD_WEIGHT
                                                                       and a.microbatch < 0))]
    if late:
        raise RuntimeError(f"worker {rank}: tied parameters need every update at the end of the iteration, but "
                           f"{late[0].kind.name} of stage {late[0].stage} follows a STEP")
