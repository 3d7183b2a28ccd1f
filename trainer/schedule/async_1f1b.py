"""PipeDream's asynchronous 1F1B: NOAM warm-up, steady 1B1F, weight stashing, optional vertical sync.

``microbatches`` counts microbatches in total (there is no flush); ``per_update`` of them make
one batch, and a stage updates its weights once per batch. Stage ``s`` admits
NOAM_s = ceil(workers from s on / replicas of s) forwards per replica, then alternates one
backward and one forward; after the backward that completes a batch it takes one STEP, so a
replica's version counts the updates it has made. Gradients of a batch's microbatches accumulate
until that STEP, each computed against the version its forward used (weight stashing), as
PipeDream-2BW does with gradient accumulation. ``per_update=1`` is PipeDream's original: one
update per minibatch.

Replicas (our choice, as the reference runtime does with DistributedDataParallel): the replicas
of a stage all-reduce their gradients after every *round* of backwards (the j-th backward of
every replica) that completes a batch, then step together, so they always hold the same version.
So ``per_update`` must be a multiple of every stage's replica count (each update is exactly one
batch: per_update / replicas backwards per replica) or divide it (each round completes
replicas / per_update batches and is one update: with ``per_update=1``, PipeDream's replicas
averaging one minibatch each), and ``microbatches`` a whole number of batches and rounds.

Weight stashing: a backward uses the version its forward used. With vertical sync every stage
runs microbatch ``i`` (forward and backward) with the version the input stage used for ``i``;
that needs equal replica counts on all stages (a version counts updates of a stage's replicas).
Stage s has always produced that version already (the input stage's update v needs stage s's
backwards of batch v-1, after which stage s steps at once) and keeps it while a forward or
backward still names it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeboard.trainer.schedule.actions import Action, Kind, Schedule, ScheduleError
from pipeboard.trainer.schedule.builder import build
from pipeboard.trainer.schedule.flush import backward_ops, one_f_one_b_order
from pipeboard.trainer.schedule.topology import Topology

if TYPE_CHECKING:
    from pipeboard.trainer.schedule.registry import BuildContext


def check_pipedream(topo: Topology, m: int, per_update: int, vertical_sync: bool) -> None:
    """ScheduleError naming the rule when ``m`` microbatches in batches of ``per_update`` cannot run."""
    if per_update < 1:
        raise ScheduleError(f"per_update (microbatches per weight update) must be >= 1, got {per_update}")
    if m % per_update:
        raise ScheduleError(f"microbatches ({m}) must be a whole number of batches of {per_update} for pipedream")
    for s in range(topo.num_stages):
        r = topo.replicas(s)
        if per_update % r and r % per_update:
            raise ScheduleError(
                f"microbatches per update ({per_update}) must be a multiple of stage {s}'s replicas ({r}) "
                "(or divide it) for pipedream: replicas all-reduce and step after the round that ends a batch"
            )
        if m % r:
            raise ScheduleError(
                f"microbatches ({m}) must be a multiple of stage {s}'s replicas ({r}) "
                "for pipedream: replicas all-reduce after each round of backwards"
            )
    if vertical_sync and len({topo.replicas(s) for s in range(topo.num_stages)}) > 1:
        raise ScheduleError(
            "vertical_sync needs the same replica count on every stage: a version counts rounds of a "
            "stage's replicas, so versions of stages with different counts name different minibatches"
        )


def pipedream_programs(topo: Topology, m: int, vertical_sync: bool, split: bool,
                       per_update: int = 1) -> list[list[Action]]:
    check_pipedream(topo, m, per_update, vertical_sync)
    programs: list[list[Action]] = [[] for _ in range(topo.num_workers)]
    input_version: dict[int, int] = {}  # microbatch -> version the input stage used
    for s in range(topo.num_stages):
        group = topo.group(s)
        r = len(group)
        for rank in group:
            ops: list[Action] = []
            version = 0
            backwards = 0
            used: dict[int, int] = {}
            for kind, i in one_f_one_b_order(topo.microbatches_of(rank, s, m), topo.noam(s)):
                if kind is Kind.FORWARD:
                    used[i] = input_version[i] if (vertical_sync and s > 0) else version
                    if used[i] > version:  # cannot happen (see the module docstring); never run it
                        raise ScheduleError(f"stage {s}: microbatch {i} needs version {used[i]}, "
                                            f"which this stage has not produced yet ({version})")
                    if s == 0:
                        input_version[i] = used[i]
                    ops.append(Action(Kind.FORWARD, s, i, used[i]))
                    continue
                ops += backward_ops(s, i, used[i], split)
                backwards += 1
                if (backwards * r) % per_update:
                    continue  # this round does not end a batch: keep accumulating
                if r > 1:
                    ops.append(Action(Kind.ALLREDUCE, s, -1, version, group=group))
                version += 1
                ops.append(Action(Kind.STEP, s, -1, version))
            programs[rank] = ops
    return programs


def pipedream_builder(ctx: BuildContext) -> list[list[Action]]:
    """The registry's builder of ``pipedream``."""
    return pipedream_programs(ctx.topology, ctx.microbatches, ctx.vertical_sync, ctx.split_backward, ctx.per_update)


def build_pipedream(num_stages: int, microbatches: int, per_update: int, *, replicas: list[int] | None = None,
                    vertical_sync: bool = False, split_backward: bool = False,
                    batch_weight_grads: bool = False) -> Schedule:
    """``build("pipedream", ..., per_update=per_update)``: ``microbatches`` in total, ``per_update``
    of them per weight update."""
    return build("pipedream", num_stages, microbatches, replicas=replicas, vertical_sync=vertical_sync,
                 split_backward=split_backward, batch_weight_grads=batch_weight_grads, per_update=per_update)
