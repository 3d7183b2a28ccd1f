"""PipeDream's asynchronous 1F1B: NOAM warm-up, steady 1B1F, weight stashing, optional vertical sync.

``microbatches`` counts minibatches in total (there is no flush). Stage ``s`` admits
NOAM_s = ceil(workers from s on / replicas of s) forwards per replica, then alternates one
backward and one forward; after every backward it updates its weights (one STEP), so a
replica's version counts the updates it has made.

Replicas (our choice, as the reference runtime does with DistributedDataParallel): the replicas
of a stage all-reduce their gradients after each *round* of backwards (the j-th backward of every
replica) and then step together, so they always hold the same version. This needs the number of
minibatches to be a multiple of every stage's replica count.

Weight stashing: a backward uses the version its forward used. With vertical sync every stage
runs minibatch ``i`` (forward and backward) with the version the input stage used for ``i``;
that needs equal replica counts on all stages (a version counts rounds of a stage's replicas).
"""

from __future__ import annotations

from trainer.schedule.actions import Action, Kind, ScheduleError
from trainer.schedule.flush import backward_ops, one_f_one_b_order
from trainer.schedule.topology import Topology


def pipedream_programs(topo: Topology, m: int, vertical_sync: bool, split: bool) -> list[list[Action]]:
    for s in range(topo.num_stages):
        if m % topo.replicas(s):
            raise ScheduleError(
                f"microbatches ({m}) must be a multiple of stage {s}'s replicas ({topo.replicas(s)}) "
                "for pipedream: replicas all-reduce after each round of backwards"
            )
    if vertical_sync and len({topo.replicas(s) for s in range(topo.num_stages)}) > 1:
        raise ScheduleError(
            "vertical_sync needs the same replica count on every stage: a version counts rounds of a "
            "stage's replicas, so versions of stages with different counts name different minibatches"
        )
    programs: list[list[Action]] = [[] for _ in range(topo.num_workers)]
    input_version: dict[int, int] = {}  # minibatch -> version the input stage used
    for s in range(topo.num_stages):
        group = topo.group(s)
        for rank in group:
            ops: list[Action] = []
            version = 0
            used: dict[int, int] = {}
            for kind, i in one_f_one_b_order(topo.microbatches_of(rank, s, m), topo.noam(s)):
                if kind is Kind.FORWARD:
                    used[i] = input_version[i] if (vertical_sync and s > 0) else version
                    if s == 0:
                        input_version[i] = used[i]
                    ops.append(Action(Kind.FORWARD, s, i, used[i]))
                    continue
                ops += backward_ops(s, i, used[i], split)
                if len(group) > 1:
                    ops.append(Action(Kind.ALLREDUCE, s, -1, version, group=group))
                version += 1
                ops.append(Action(Kind.STEP, s, -1, version))
            programs[rank] = ops
    return programs
