"""What a training run is: one plain, validated configuration shared by the launcher and workers.

A ``RunConfig`` travels (pickled) to every worker process, so it holds only plain data. Validation
happens once, in the launcher, and names the offending field. What a schedule can do comes from
the schedule registry (trainer/schedule/registry.py), never from comparing its name.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from pipeboard.trainer.precision import PRECISIONS
from pipeboard.trainer.schedule import registry
from pipeboard.trainer.schedule.registry import WEIGHT_GRADS, ScheduleSpec
from pipeboard.trainer.task.names import OPTIMIZERS

P2P_MODES = ("auto", "shm", "gloo")


def __getattr__(name: str) -> Any:
    if name == "SCHEDULES":  # the old constant: every registered schedule's name, now
        return registry.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ConfigError(ValueError):
    """A run configuration that cannot work; the message names the field."""


@dataclass
class RunConfig:
    model: str  # a zoo name, or a task factory 'package.module:function' / 'path/to/file.py:function'
    schedule: str  # a registered schedule's name (pipeboard.trainer.schedule.registry)
    batch_size: int
    microbatches: int
    model_args: dict[str, Any] = field(default_factory=dict)
    # a job's own torch schedule file (its layout.schedule_file), as text: registered as `schedule`
    # in every process of the run that asks for the schedule (``spec``; spawned workers: worker_main)
    schedule_csv: str | None = None
    data: str | None = None  # the data location handed to the task factory as data=
    precision: str = "fp32"  # or "bf16": autocast forwards, float32 master weights (trainer/precision.py)
    loader_workers: int | None = None  # DataLoader processes per loading stage; None: the task's
    # Layout: layer names per stage (from a plan) or a uniform split into num_stages.
    stages: list[list[str]] | None = None
    num_stages: int | None = None
    replicas: list[int] | None = None  # per stage; default 1 each (dp: the worker count)
    workers: int | None = None  # total processes; with --stages P, N/P replicas per stage
    chunks: int = 1  # model chunks per worker (schedules that take chunks: interleaved-1f1b)
    vertical_sync: bool = False  # schedules that take it: pipedream
    # "batched": each backward computes input gradients only and one pass per update computes the
    # weight gradients of all its microbatches; "immediate": each backward computes both. Where a
    # schedule does not honour them (its spec's weight_grads), it ignores this: dp and zb-h1
    # (zb-h1 places its W itself).
    weight_grads: str = "batched"
    # virtual stages whose activations are recomputed in the backward (torch.utils.checkpoint over
    # the stage's layers): a stage keeps only its inputs per microbatch in flight; None: none.
    # "none" and "all" (a job's layout.recompute) are resolved by with_plan, which knows the stages.
    recompute: list[int] | str | None = None
    # Length: exactly one of these is normally set; none means one epoch.
    epochs: float | None = None
    steps: int | None = None
    target: float | None = None
    max_steps: int | None = None  # upper bound for --target runs
    # Training
    seed: int = 0
    lr: float | None = None  # default: the task's
    optimizer: str | None = None  # 'adam' | 'adamw' | 'sgd'; default: the task's
    eval_every: int | None = None  # steps; default: once per epoch with --target, else at the end only
    eval_at_end: bool = True
    # Checkpoints
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0  # steps; 0 = only at the end when a directory is given
    checkpoint_keep: int = 2  # complete checkpoints kept (the newest); older ones are deleted
    resume: bool = False
    # Resume from the newest complete checkpoint at or before this step (None: the newest): a
    # caller whose records of the run end at step S (a run lost before it reported its last
    # steps) continues from a checkpoint it has every step up to.
    resume_at_most: int | None = None
    # Machinery
    device: str = "cpu"
    threads: int | None = None  # torch threads per worker; default: the usable cores / workers (>= 1)
    instrument: bool = True  # record every action's start and end
    hang_timeout_s: float = 30.0  # a worker making no progress this long (not waiting on a peer) is hung
    # Stage-to-stage transfers: "gloo", "auto" (shared memory between workers on one host, else
    # gloo) or "shm" (the same, an error where unsupported); None: $PIPEBOARD_P2P, else auto.
    p2p: str | None = None
    # float32 matrix products on CPU workers: "default" (PyTorch's BLAS) or "onednn" (see
    # trainer/cpu_matmul.py: faster on some AMD processors; docs/runtime.md has the figures);
    # None: $PIPEBOARD_CPU_MATMUL, else default.
    cpu_matmul: str | None = None
    start_method: str | None = None  # default: fork on CPU (no re-import of torch), spawn on CUDA
    master_port: int | None = None  # default: a free port
    fail_at: dict[str, Any] | None = None  # a failure to inject (runtime/fault_injection.py): {"rank", "step", "mode"}

    def with_(self, **changes: Any) -> RunConfig:
        return replace(self, **changes)

    @classmethod
    def from_dict(cls, data: Any) -> RunConfig:
        """A configuration from its plain form (a run file: `pipeboard train --config`). A key it
        does not have is refused by name rather than ignored: an option lost between the service
        and the run must fail loudly. Values are checked by ``validate``."""
        if not isinstance(data, dict):
            raise ConfigError(f"run configuration: must be a JSON object, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(k for k in data if k not in known)
        if unknown:
            raise ConfigError(f"{unknown[0]}: not a field of the run configuration (trainer/runtime/run_config.py)")
        missing = [n for n, f in known.items() if f.default is MISSING and f.default_factory is MISSING and n not in data]
        if missing:
            raise ConfigError(f"{missing[0]}: the run configuration needs it")
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"--config: {path} is not JSON: {exc}") from None
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def with_plan(self, plan: Any) -> RunConfig:
        """The layout of a plan (pipeboard.trainer.plan.Plan): its stages and replicas; under a
        data-parallel schedule its layers all on one stage, its workers all replicas of it."""
        stages = [list(s.layers) for s in plan.stages]
        replicas = [int(s.replicas) for s in plan.stages]
        if registry.known(self.schedule) and registry.is_data_parallel(self.schedule):
            # one stage, on every worker: "all" is it; other numbers stay for validate to name
            recompute = [0] if self.recompute == "all" else None if self.recompute == "none" else self.recompute
            return replace(self, stages=[[n for s in stages for n in s]], replicas=None, num_stages=None,
                           workers=self.workers or sum(replicas), recompute=recompute or None)
        # the run's own choice (a job's layout.recompute: "all" is every virtual stage of this
        # plan) stands; else a plan made under a memory cap says which stages recompute
        # (trainer/plan/memory_fit.py)
        flags = (getattr(plan, "options", None) or {}).get("recompute")
        if self.recompute == "all":  # a plan has a stage per virtual stage (chunks included)
            recompute = list(range(len(stages)))
        elif self.recompute not in (None, "none"):
            recompute = self.recompute
        elif flags and len(flags) == len(stages) and self.chunks == 1:
            recompute = [s for s, on in enumerate(flags) if on]
        else:
            recompute = None
        return replace(self, stages=stages, replicas=replicas, num_stages=None, recompute=recompute or None)

    @property
    def microbatch_size(self) -> int:
        return self.batch_size // self.microbatches

    @property
    def spec(self) -> ScheduleSpec:
        """The schedule's registry entry: what it can do."""
        if self.schedule_csv is not None:
            return self.register_schedule()
        try:
            return registry.get(self.schedule)
        except registry.UnknownSchedule as exc:
            raise ConfigError(f"schedule: {exc}") from None

    def register_schedule(self) -> ScheduleSpec:
        """Register the run's own schedule file as ``schedule`` in this process (once per text)."""
        from pipeboard.trainer.schedule.actions import ScheduleError
        from pipeboard.trainer.schedule.torchcsv import register_text

        if not self.schedule.startswith("custom"):
            raise ConfigError(f"schedule: a run with its own schedule file names it custom-..., got {self.schedule!r}")
        try:
            return register_text(self.schedule_csv, self.schedule)
        except ScheduleError as exc:
            raise ConfigError(f"schedule_csv: {exc}") from None

    @property
    def is_async(self) -> bool:
        return not self.spec.synchronous

    def validate(self) -> None:
        self.spec  # noqa: B018  (ConfigError naming the field for an unknown schedule)
        if self.batch_size < 1:
            raise ConfigError(f"batch_size: must be >= 1, got {self.batch_size}")
        if self.microbatches < 1:
            raise ConfigError(f"microbatches: must be >= 1, got {self.microbatches}")
        if self.batch_size % self.microbatches:
            raise ConfigError(
                f"microbatches: batch_size {self.batch_size} is not divisible into {self.microbatches} microbatches")
        if self.stages is not None and self.num_stages is not None and len(self.stages) != self.num_stages:
            raise ConfigError("stages: a plan's stages and num_stages disagree")
        if self.num_stages is not None and self.num_stages < 1:
            raise ConfigError(f"stages: must be >= 1, got {self.num_stages}")
        if self.stages is not None and any(not s for s in self.stages):
            raise ConfigError("stages: every stage needs at least one layer")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"workers: must be >= 1, got {self.workers}")
        if self.replicas is not None and any(r < 1 for r in self.replicas):
            raise ConfigError(f"replicas: every stage needs >= 1 replica, got {self.replicas}")
        if self.weight_grads not in WEIGHT_GRADS:
            raise ConfigError(f"weight_grads: must be one of {', '.join(WEIGHT_GRADS)}, got {self.weight_grads!r}")
        if self.chunks < 1:
            raise ConfigError(f"chunks: must be >= 1, got {self.chunks}")
        if self.recompute == "none":
            self.recompute = None
        if isinstance(self.recompute, str):
            raise ConfigError(f"recompute: {self.recompute!r} is resolved against a plan's stages (with_plan); "
                              "give stage numbers here")
        if self.recompute is not None:
            # a plan's stages are the virtual stages already; num_stages counts workers' stages
            total = (len(self.stages) if self.stages is not None
                     else self.num_stages * self.chunks if self.num_stages is not None else None)
            for s in self.recompute:
                if isinstance(s, bool) or not isinstance(s, int) or s < 0 or (total is not None and s >= total):
                    raise ConfigError(f"recompute: stage {s!r} is not a stage of this run"
                                      + (f" (0..{total - 1})" if total is not None else ""))
        given = [n for n, v in (("epochs", self.epochs), ("steps", self.steps), ("target", self.target)) if v is not None]
        if len(given) > 1:
            raise ConfigError(f"{given[1]}: give only one of --epochs, --steps, --target")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps: must be >= 1, got {self.max_steps}")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"steps: must be >= 1, got {self.steps}")
        if self.epochs is not None and self.epochs <= 0:
            raise ConfigError(f"epochs: must be > 0, got {self.epochs}")
        if self.eval_every is not None and self.eval_every < 1:
            raise ConfigError(f"eval_every: must be >= 1, got {self.eval_every}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every: must be >= 0, got {self.checkpoint_every}")
        if self.checkpoint_keep < 1:
            raise ConfigError(f"checkpoint_keep: must be >= 1, got {self.checkpoint_keep}")
        if self.resume_at_most is not None and self.resume_at_most < 0:
            raise ConfigError(f"resume_at_most: must be >= 0, got {self.resume_at_most}")
        if self.resume and not self.checkpoint_dir:
            raise ConfigError("resume: needs --checkpoint-dir")
        if self.optimizer is not None and self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer: unknown optimizer {self.optimizer!r} (known: {', '.join(OPTIMIZERS)})")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision: must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.loader_workers is not None and self.loader_workers < 0:
            raise ConfigError(f"loader_workers: must be >= 0, got {self.loader_workers}")
        if self.lr is not None and self.lr <= 0:
            raise ConfigError(f"lr: must be > 0, got {self.lr}")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device: must be cpu or cuda, got {self.device!r}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads: must be >= 1, got {self.threads}")
        if self.p2p is not None and self.p2p not in P2P_MODES:
            raise ConfigError(f"p2p: must be one of {', '.join(P2P_MODES)}, got {self.p2p!r}")
        from pipeboard.trainer import cpu_matmul

        try:
            matmul = cpu_matmul.configured(self.cpu_matmul)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if matmul == "onednn" and self.device == "cpu" and not cpu_matmul.available():
            raise ConfigError("cpu_matmul: onednn needs a PyTorch build with oneDNN (mkldnn); this one has none")
        if self.hang_timeout_s <= 0:
            raise ConfigError(f"hang_timeout_s: must be > 0, got {self.hang_timeout_s}")
