"""Which layers each stage holds, how many replicas it has, and the schedule that runs them.

Resolved identically in the launcher (to know how many processes to start) and in every worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.runtime.config import ConfigError, RunConfig
from trainer.schedule import Schedule, build
from trainer.schedule.pipedream import build_pipedream


@dataclass(frozen=True)
class Layout:
    schedule: str
    physical_stages: int  # stages of the pipeline (dp: 1)
    chunks: int  # model chunks per worker (interleaved-1f1b)
    replicas: tuple[int, ...]  # per physical stage
    vertical_sync: bool
    per_update: int = 1  # pipedream: microbatches per weight update (one batch)
    batch_weight_grads: bool = False  # one batched weight-gradient pass per update (not dp, zb-h1)

    @property
    def virtual_stages(self) -> int:
        return self.physical_stages * self.chunks

    @property
    def world(self) -> int:
        return sum(self.replicas)

    def build(self, microbatches: int) -> Schedule:
        """The schedule for ``microbatches`` (per iteration, or in total for pipedream, which
        updates once per ``per_update`` of them)."""
        if self.schedule == "pipedream":
            return build_pipedream(self.physical_stages, microbatches, self.per_update, replicas=list(self.replicas),
                                   vertical_sync=self.vertical_sync, batch_weight_grads=self.batch_weight_grads)
        if self.schedule == "dp":
            return build("dp", self.replicas[0], microbatches, replicas=[self.replicas[0]])
        if self.schedule == "interleaved-1f1b":
            return build(self.schedule, self.physical_stages, microbatches, chunks=self.chunks,
                         batch_weight_grads=self.batch_weight_grads)
        return build(self.schedule, self.physical_stages, microbatches, replicas=list(self.replicas),
                     vertical_sync=self.vertical_sync, batch_weight_grads=self.batch_weight_grads)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The virtual stages worker ``rank`` holds (ranks are stage-major; interleaved: round robin)."""
        if self.chunks > 1:
            return tuple(c * self.physical_stages + rank for c in range(self.chunks))
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
    """The layout ``cfg`` asks for; contradictions are a ``ConfigError`` naming the field."""
    if cfg.schedule == "dp":
        if (cfg.num_stages or 1) != 1 or (cfg.stages is not None and len(cfg.stages) != 1):
            raise ConfigError("stages: dp trains the whole model on every worker; give --workers, not --stages")
        n = cfg.workers or (cfg.replicas[0] if cfg.replicas else 2)
        return Layout("dp", 1, 1, (n,), False)
    p = len(cfg.stages) if cfg.stages is not None else (cfg.num_stages or 2)
    chunks = cfg.chunks
    if cfg.schedule == "interleaved-1f1b":
        if chunks < 2:
            chunks = 2
        if cfg.stages is not None:
            if len(cfg.stages) % chunks:
                raise ConfigError(f"stages: {len(cfg.stages)} plan stages do not divide into {chunks} chunks")
            p = len(cfg.stages) // chunks
        if cfg.workers is not None and cfg.workers != p:
            raise ConfigError(f"workers: interleaved-1f1b runs one worker per stage ({p}), got {cfg.workers}")
        if cfg.replicas is not None and any(r != 1 for r in cfg.replicas):
            raise ConfigError("replicas: interleaved-1f1b does not replicate stages (the plan has replicas > 1)")
        return Layout(cfg.schedule, p, chunks, (1,) * p, False, batch_weight_grads=_batched(cfg))
    if chunks != 1:
        raise ConfigError(f"chunks: only interleaved-1f1b holds several chunks per worker, not {cfg.schedule}")
    if cfg.replicas is not None:
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
    if cfg.schedule == "pipedream" and any(cfg.microbatches % r for r in replicas):
        raise ConfigError(f"microbatches: pipedream's replicas all-reduce and step once per batch, so its "
                          f"{cfg.microbatches} microbatches must be a multiple of every stage's replica count "
                          f"{list(replicas)}")
    if cfg.vertical_sync and cfg.schedule != "pipedream":
        raise ConfigError("vertical_sync: applies to the pipedream schedule only")
    return Layout(cfg.schedule, p, 1, replicas, cfg.vertical_sync,
                  cfg.microbatches if cfg.schedule == "pipedream" else 1, _batched(cfg))


def _batched(cfg: RunConfig) -> bool:
    """Batched weight gradients, where they apply: not dp (DDP reduces inside the backward) and
    not zb-h1 (its W are placed one by one to fill the drain)."""
    return cfg.weight_grads == "batched" and cfg.schedule not in ("dp", "zb-h1")
