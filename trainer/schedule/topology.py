"""Which worker holds which (virtual) stage, and which replica runs which microbatch.

Ranks are stage-major: stage 0's replicas come first, then stage 1's, and so on. Microbatch ``i``
of a replicated stage runs on replica ``i % replicas`` (round robin, as PipeDream assigns
minibatches to a stage's replicas). With interleaving (``chunks`` > 1) worker ``w`` of ``p``
holds virtual stages ``w, w + p, ..., w + (chunks - 1) * p`` and stages are not replicated.
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


def interleaved(num_workers: int, chunks: int) -> Topology:
    if num_workers < 1 or chunks < 1:
        raise ScheduleError(f"stages and chunks must be >= 1, got {num_workers} and {chunks}")
    total = num_workers * chunks
    stage_ranks = tuple((j % num_workers,) for j in range(total))
    workers = tuple(
        WorkerSpec(rank=w, stages=tuple(c * num_workers + w for c in range(chunks))) for w in range(num_workers)
    )
    return Topology(total, stage_ranks, workers)
