"""Which layers each stage holds, how many replicas it has, and the schedule that runs them.

Resolved identically in the launcher (to know how many processes to start) and in every worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeboard.trainer.runtime.run_config import ConfigError, RunConfig
from pipeboard.trainer.schedule import Schedule, build, registry
from pipeboard.trainer.schedule.topology import chunk_stages


@dataclass(frozen=True)
class Layout:
    schedule: str
    physical_stages: int  # stages of the pipeline (data parallel: 1)
    chunks: int  # model chunks per worker (schedules that take chunks)
    replicas: tuple[int, ...]  # per physical stage
    vertical_sync: bool
    per_update: int = 1  # asynchronous schedules (pipedream): microbatches per weight update (one batch)
    batch_weight_grads: bool = False  # one batched weight-gradient pass per update (where honoured)

    @property
    def virtual_stages(self) -> int:
        return self.physical_stages * self.chunks

    @property
    def world(self) -> int:
        return sum(self.replicas)

    def build(self, microbatches: int) -> Schedule:
        """The schedule for ``microbatches`` (per iteration, or in total for an asynchronous
        schedule, which updates once per ``per_update`` of them)."""
        return build(self.schedule, self.physical_stages, microbatches, replicas=list(self.replicas),
                     chunks=self.chunks, vertical_sync=self.vertical_sync,
                     batch_weight_grads=self.batch_weight_grads, per_update=self.per_update)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The virtual stages worker ``rank`` holds (ranks are stage-major; chunks: placed as the
        schedule declares, ``topology.chunk_stages``)."""
        if self.chunks > 1:
            if not 0 <= rank < self.physical_stages:
                raise ValueError(f"rank {rank} is outside the layout's {self.world} workers")
            return chunk_stages(rank, self.physical_stages, self.chunks, registry.get(self.schedule).placement)
        first = 0
        for s, r in enumerate(self.replicas):
            if rank < first + r:
                return (s,)
            first += r
        raise ValueError(f"rank {rank} is outside the layout's {self.world} workers")

    def describe(self) -> dict:
        return {"schedule": self.schedule, "stages": self.physical_stages, "chunks": self.chunks,
                "replicas": list(self.replicas)}


def resolve(cfg: RunConfig) -> Layout:
    """The layout ``cfg`` asks for; contradictions are a ``ConfigError`` naming the field. What
    the schedule allows comes from its registry entry (``cfg.spec``)."""
    spec, name = cfg.spec, cfg.schedule
    if spec.data_parallel:
        if (cfg.num_stages or 1) != 1 or (cfg.stages is not None and len(cfg.stages) != 1):
            raise ConfigError(f"stages: {name} trains the whole model on every worker; give --workers, not --stages")
        n = cfg.workers or (cfg.replicas[0] if cfg.replicas else 2)
        return Layout(name, 1, 1, (n,), False)
    p = len(cfg.stages) if cfg.stages is not None else (cfg.num_stages or 2)
    chunks = cfg.chunks
    if spec.chunks:
        if chunks == 1:
            chunks = spec.default_chunks
        if cfg.stages is not None:
            if len(cfg.stages) % chunks:
                raise ConfigError(f"stages: {len(cfg.stages)} plan stages do not divide into {chunks} chunks")
            p = len(cfg.stages) // chunks
    elif chunks != 1:
        takers = registry.having(chunks=True)
        raise ConfigError(f"chunks: only {registry.either(takers, quote='')} hold{'s' * (len(takers) == 1)} "
                          f"several chunks per worker, not {name}")
    if not spec.replication:
        if cfg.workers is not None and cfg.workers != p:
            raise ConfigError(f"workers: {name} runs one worker per stage ({p}), got {cfg.workers}")
        if cfg.replicas is not None and any(r != 1 for r in cfg.replicas):
            raise ConfigError(f"replicas: {name} does not replicate stages (the plan has replicas > 1)")
        replicas = (1,) * p
    elif cfg.replicas is not None:
        if len(cfg.replicas) != p:
            raise ConfigError(f"replicas: {len(cfg.replicas)} counts for {p} stages")
        replicas = tuple(cfg.replicas)
        if cfg.workers is not None and cfg.workers != sum(replicas):
            raise ConfigError(f"workers: the plan needs {sum(replicas)} workers, got {cfg.workers}")
    elif cfg.workers is not None:
        if cfg.workers % p:
            raise ConfigError(f"workers: {cfg.workers} workers do not divide evenly over {p} stages")
        replicas = (cfg.workers // p,) * p
    else:
        replicas = (1,) * p
    if not spec.synchronous and any(cfg.microbatches % r for r in replicas):
        raise ConfigError(f"microbatches: {name}'s replicas all-reduce and step once per batch, so its "
                          f"{cfg.microbatches} microbatches must be a multiple of every stage's replica count "
                          f"{list(replicas)}")
    if cfg.vertical_sync and not spec.vertical_sync:
        raise ConfigError(f"vertical_sync: applies to the "
                          f"{registry.either(registry.having(vertical_sync=True), quote='')} schedule only")
    return Layout(name, p, chunks, replicas, cfg.vertical_sync,
                  1 if spec.synchronous else cfg.microbatches, _batched(cfg))


def _batched(cfg: RunConfig) -> bool:
    """Batched weight gradients, where the schedule honours them: not dp (DDP reduces inside the
    backward) and not zb-h1 (its W are placed one by one to fill the drain)."""
    return cfg.weight_grads == "batched" and "batched" in cfg.spec.weight_grads
