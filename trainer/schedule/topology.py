"""Which worker holds which (virtual) stage, and which replica runs which microbatch.

Ranks are stage-major: stage 0's replicas come first, then stage 1's, and so on. Microbatch ``i``
of a replicated stage runs on replica ``i % replicas`` (round robin, as PipeDream assigns
minibatches to a stage's replicas). With several model chunks per worker (``chunks`` > 1)
stages are not replicated, and the schedule's declared placement (``PLACEMENTS``) says which
virtual stages worker ``w`` of ``p`` holds; ``chunk_stages`` is the one formula for it:

- ``loop``: ``w, w + p, ..., w + (chunks - 1) p`` (Megatron's interleaving, looped BFS);
- ``v``: down the workers and back up, ``w, 2p - 1 - w, 2p + w, 4p - 1 - w, ...`` (ZB-V,
  DualPipeV): the first and last virtual stages sit on worker 0, so the loss is computed where
  the input enters, and the turn of the V (stages p - 1 and p) is on one worker, with no transfer.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from pipeboard.trainer.schedule.actions import ScheduleError, WorkerSpec


@dataclass(frozen=True)
class Topology:
    num_stages: int  # virtual stages
    stage_ranks: tuple[tuple[int, ...], ...]  # virtual stage -> ranks of its replicas
    workers: tuple[WorkerSpec, ...]

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def rank_of(self, stage: int, microbatch: int) -> int:
        ranks = self.stage_ranks[stage]
        return ranks[microbatch % len(ranks)]

    def replicas(self, stage: int) -> int:
        return len(self.stage_ranks[stage])

    def microbatches_of(self, rank: int, stage: int, microbatches: int) -> list[int]:
        """The microbatches (in order) that worker ``rank`` runs for ``stage``."""
        ranks = self.stage_ranks[stage]
        r = ranks.index(rank)
        return list(range(r, microbatches, len(ranks)))

    def group(self, stage: int) -> tuple[int, ...]:
        return self.stage_ranks[stage]

    def noam(self, stage: int) -> int:
        """PipeDream's NOAM for ``stage``: in-flight microbatches one replica keeps in steady state.

        ceil(workers from this stage to the output / replicas of this stage); for the input
        stage this is the paper's ceil(workers / input-stage replicas), for an unreplicated
        pipeline it is p - s.
        """
        downstream = sum(len(r) for r in self.stage_ranks[stage:])
        return ceil(downstream / len(self.stage_ranks[stage]))


def replicated(num_stages: int, replicas: list[int] | None) -> Topology:
    if num_stages < 1:
        raise ScheduleError(f"num_stages must be >= 1, got {num_stages}")
    reps = [1] * num_stages if replicas is None else [int(r) for r in replicas]
    if len(reps) != num_stages:
        raise ScheduleError(f"replicas must list one count per stage ({num_stages}), got {len(reps)}")
    if any(r < 1 for r in reps):
        raise ScheduleError(f"replicas must all be >= 1, got {reps}")
    stage_ranks, workers, rank = [], [], 0
    for s, r in enumerate(reps):
        ranks = tuple(range(rank, rank + r))
        stage_ranks.append(ranks)
        workers.extend(WorkerSpec(rank=k, stages=(s,), replica=k - rank) for k in ranks)
        rank += r
    return Topology(num_stages, tuple(stage_ranks), tuple(workers))


PLACEMENTS = ("loop", "v")  # how a schedule's chunks sit on its workers (registry: ScheduleSpec.placement)


def chunk_stages(rank: int, num_workers: int, chunks: int, placement: str = "loop") -> tuple[int, ...]:
    """The virtual stages worker ``rank`` of ``num_workers`` holds, chunk by chunk (see the module
    docstring). Every caller that maps workers to chunks (the builders' topology, the runtime's
    layout) asks here."""
    if placement == "loop":
        return tuple(c * num_workers + rank for c in range(chunks))
    if placement == "v":  # even chunks go down the workers, odd ones come back up
        return tuple(c * num_workers + (rank if c % 2 == 0 else num_workers - 1 - rank) for c in range(chunks))
    raise ScheduleError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")


def interleaved(num_workers: int, chunks: int, placement: str = "loop") -> Topology:
    """One worker per physical stage, each holding ``chunks`` virtual stages as ``placement`` says."""
    if num_workers < 1 or chunks < 1:
        raise ScheduleError(f"stages and chunks must be >= 1, got {num_workers} and {chunks}")
    workers = tuple(WorkerSpec(rank=w, stages=chunk_stages(w, num_workers, chunks, placement))
                    for w in range(num_workers))
    owner = {s: w.rank for w in workers for s in w.stages}
    stage_ranks = tuple((owner[j],) for j in range(num_workers * chunks))
    return Topology(num_workers * chunks, stage_ranks, workers)
