"""Jobs as the API answers them: their attempts, fidelity, timelines and metrics (what a job is asked to do: jobspec.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from pipeboard.app.schemas.common import JobStatus, Stored
from pipeboard.app.schemas.jobspec import JobSpec, ProfileJobSpec


class AttemptPublic(BaseModel):
    attempt: int
    trigger: Literal["submit", "auto", "manual"] = Field(description="What started it: the submit, an automatic retry of a lost attempt, a retry request.")
    status: JobStatus
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    resume_step: int | None = Field(default=None, description="The checkpoint step it continued from (0: the start); null until it trains.")
    offset_s: float | None = Field(default=None, description="Where its training begins on the job's timeline and metric clock, in seconds.")
    error: str | None = None
    hosts: dict[str, str] | None = Field(default=None, description="Which host ran each worker (rank).")
    nodes: list[str] = Field(default_factory=list, description="The worker hosts (node names) it ran on.")
    waiting: str | None = Field(default=None, description=(
        "Why a queued cuda attempt has not started (app/services/placement.py): e.g. `waiting for a worker with a "
        "GPU (no live worker reports one)`, `waiting: all 2 GPUs busy (needs 1)`, `waiting: needs 4 GPUs, largest "
        "free block 2`; null once placed."))


class FidelityStage(Stored):
    name: str | None = None
    stage: int | None = None
    predicted_s: float | None = None
    measured_s: float | None = None
    factor: float | None = None
    moved: bool | None = None
    samples: int | None = None


class FidelityTerm(BaseModel):
    factor: float | None = Field(description="Measured over predicted seconds per action (median over stages); null where the prediction was 0.")
    predicted_s: float = Field(description="Predicted seconds per action (median over stages).")
    measured_s: float = Field(description="Measured seconds per action (median over stages).")
    moved: bool = Field(description="Whether any stage's factor is more than 5% away from 1 (or a term predicted 0 was measured).")
    stages: list[FidelityStage] = Field(description="Per stage: what was predicted and measured.")


class Fidelity(BaseModel):
    """A train job's predicted against measured time per step (docs/api.md, "Prediction fidelity")."""

    predicted_step_s: float | None = Field(description="The plan's predicted seconds per step (see `basis`).")
    basis: Literal["steady_step_s", "iteration_time_s"] | None = Field(
        description="`steady_step_s`: the simulator's steady state under the profile's costs; `iteration_time_s`: one "
                    "simulated iteration, fill and drain included (plans without the profile's measurements).")
    device_note: str | None = Field(default=None, description=(
        "Set where the prediction comes from figures measured on another device than the job's (a CPU profile, or "
        "a calibration measured between CPU processes, predicting a cuda job): one line saying which."))
    measured_step_s: float | None = Field(
        description="Steady-state seconds per step: the least-squares slope of step completion times over the second "
                    "half of the steps (pipeboard.trainer.schedule.measured); the run's summary `step_s` once it ends.")
    measured_steps: int | None = Field(default=None, description="Steps the measured value is from.")
    error: float | None = Field(description="measured_step_s / predicted_step_s - 1.")
    live: bool = Field(description="True while the job runs (the figures change as steps complete).")
    corrected_step_s: float | None = Field(default=None, description=(
        "The prediction re-fitted to the first steps: each predicted per-action cost replaced by the mean the run "
        "measured, the steady step simulated again (pipeboard.trainer.schedule.refit)."))
    corrected_after_step: int | None = Field(default=None, description="The step after which it was re-fitted.")
    corrected_error: float | None = Field(default=None, description="measured_step_s / corrected_step_s - 1.")
    terms: dict[str, FidelityTerm] | None = Field(default=None, description=(
        "Per cost term (forward, backward, backward_input, weight, weight_batched, step, allreduce, transfer_act, "
        "transfer_grad, gaps): what the re-fit changed."))


class StageMemory(Stored):
    stage: int
    predicted_bytes: int | None = Field(default=None, description=(
        "memory_model's peak for the worker process holding the stage (trainer/runtime/stage_memory.py); null where "
        "the run could not count it (`memory_predicted_error` says why)."))
    measured_bytes: int | None = Field(default=None, description="The peak the run measured (see `memory_source`).")


class Evaluation(BaseModel):
    step: int
    wall_s: float
    metric: float | None = None


class RunSummary(Stored):
    """How a run went (trainer/runtime/report.py and launch.py; the service adds `fidelity`,
    `stopped_by` and `attempt`). Every field is optional: a run lost early has few of them."""

    samples_per_s: float | None = Field(default=None, description="Steady-state samples per second.")
    step_s: float | None = Field(default=None, description="Steady-state seconds per step.")
    final_metric: float | None = None
    metric_name: str | None = None
    higher_is_better: bool | None = None
    best_metric: float | None = None
    final_loss: float | None = None
    steps: int | None = Field(default=None, description="Steps done (the resumed ones included).")
    start_step: int | None = None
    epochs: float | None = None
    wall_s: float | None = None
    train_s: float | None = None
    target: float | None = None
    time_to_target_s: float | None = None
    reached_target: bool | None = None
    evaluations: list[Evaluation] = Field(default_factory=list)
    cpu_matmul: str | None = None
    onednn_products: int | None = None
    schedule: str | None = None
    model: str | None = None
    workers: int | None = None
    precision: str | None = None
    batch_size: int | None = None
    microbatches: int | None = None
    attempt: int | None = Field(default=None, description="The attempt that reported it.")
    stopped_by: Literal["time"] | None = Field(default=None, description="`time`: the length's time_s ended the run.")
    fidelity: Fidelity | None = None
    profile_id: int | None = Field(default=None, description="A profiling job's stored profile.")
    memory: list[StageMemory] | None = Field(default=None, description="Per stage, predicted beside measured peak memory.")
    memory_source: str | None = Field(default=None, description=(
        "How `measured_bytes` was measured: `cuda_max_allocated` (the CUDA allocator's peak), `counted` (CPU: the "
        "stage's tensors counted in bytes: parameters, versions, gradients, optimizer state and what autograd saves), "
        "`rss_peak` (the stage process's peak resident memory: the interpreter and torch's libraries are in it), or `rss`."))


class JobPublic(BaseModel):
    id: int
    name: str
    status: JobStatus
    priority: int
    queue_position: int | None = Field(default=None, description="1 = next to run; null unless queued.")
    waiting: str | None = Field(default=None, description=(
        "Why a queued job has not started: its current attempt's `waiting` (a cuda job placement could not place "
        "yet); null otherwise."))
    spec: JobSpec | ProfileJobSpec = Field(description="The job's specification, as submitted (version 2).")
    attempt: int = 0
    error: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    heartbeat_at: datetime | None = None
    worker: str | None = None
    submitted_by: str | None = Field(default=None, description="Name of the API token that submitted the job.")
    profile_id: int | None = None
    plan_id: int | None = None
    summary: RunSummary | None = Field(default=None, description=(
        "The run's summary; a train job's carries `fidelity` when it succeeds, a profiling job's its `profile_id`."))
    fidelity: Fidelity | None = Field(default=None, description=(
        "Predicted against measured time per step: `summary.fidelity` once the job has succeeded, the live figures "
        "(also sent as `fidelity` events on the stream) while it trains; null before there are any."))
    last_event_seq: int = 0
    attempts: list[AttemptPublic] = Field(default_factory=list, description="Every attempt, oldest first.")


class TimelineEventPublic(BaseModel):
    worker: int
    stage: int
    replica: int
    microbatch: int
    kind: str
    start: float
    end: float
    step: int
    attempt: int = Field(default=1, description="The job attempt that measured it.")
    host: str | None = Field(default=None, description="The host its worker ran on (measured events).")


class TimelinePublic(BaseModel):
    source: Literal["measured", "predicted"]
    events: list[TimelineEventPublic]
    total: int = Field(description="Events in the window before downsampling.")
    downsampled: bool
    steps: list[int] = Field(description="[first, last] step present in the whole timeline; [] when empty.")
    time_range: list[float] = Field(description="[start, end] seconds of the whole timeline; [] when empty.")


class MetricPointPublic(BaseModel):
    seq: int
    step: int
    wall_s: float
    epoch: float
    values: dict[str, float]
    attempt: int = Field(default=1, description="The job attempt that measured it.")


class MetricsPublic(BaseModel):
    points: list[MetricPointPublic]
    total: int
    downsampled: bool
