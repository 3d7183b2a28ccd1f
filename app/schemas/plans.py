"""Plans: the what-if (`POST /plans`) and stored plans."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeboard.trainer.schedule import registry as schedules

from pipeboard.app.schemas.common import (
    MAX_PLAN_WORKERS, Level, Method, ScheduleName, Stored, WeightGrads, _described, schedule_field, total_workers,
    weight_grads_field)
from pipeboard.app.schemas.jobs import JobPublic
from pipeboard.app.schemas.jobspec import Recompute, spec_error

# the optimizers whose state the memory model counts (trainer.schedule.memory_model)
PlanOptimizer = Literal["adam", "adamw", "sgd", "sgd-plain"]


class PlanCreate(BaseModel):
    """Plan a profile for a cluster and simulate the result: the dashboard's what-if."""

    model_config = ConfigDict(
        strict=True,  # JSON numbers only: `"timeline_limit": false` is refused, not read as 0
        json_schema_extra={
            "examples": [
                {"model": "mlp-digits", "levels": [{"workers": 4, "bandwidth": 1e9}], "method": "pipedream", "schedule": "1f1b", "microbatches": 8}
            ]
        }
    )

    profile_id: int | None = Field(default=None, ge=1, description="A stored profile; or give `model`.")
    model: str | None = Field(default=None, min_length=1, max_length=300, description="A zoo/registered model whose profile is cached (profiled on first use).")
    model_args: dict[str, Any] = Field(default_factory=dict)
    batch_size: int = Field(default=32, ge=1, le=65536, description="With `model`: the job's batch size; the profile is measured per microbatch (batch_size // microbatches), as a job does.")
    levels: list[Level] = Field(min_length=1, max_length=4, description="Cluster levels, innermost first.")
    memory_bytes: float | None = Field(default=None, gt=0, description=(
        "Memory cap per worker in bytes: the plan is the fastest candidate whose predicted memory (parameters, "
        "gradients, optimizer state, activations in flight under `schedule`, boundary buffers) fits, with activation "
        "recompute turned on where a stage would not fit; a cap nothing fits is a 422 naming the smallest need."))
    recompute: Recompute = Field(default="none", description=(
        "Activation recompute, as a job's `layout.recompute`: `none`, `all`, or the (virtual) stage numbers that "
        "recompute; under `memory_bytes` more stages may be turned on. The prediction counts its time and memory."))
    optimizer: PlanOptimizer = Field(default="adam", description="The optimizer whose state the predicted memory counts.")
    method: Method = "pipedream"
    schedule: ScheduleName = schedule_field("Schedule simulated for the predicted timeline.")
    microbatches: int = Field(default=8, ge=1, le=1024, description="Microbatches per simulated iteration.")
    chunks: int = Field(default=1, ge=1, le=16, json_schema_extra=_described(lambda: (
        f"Model chunks per worker ({schedules.either(schedules.having(chunks=True), quote='')}).")))
    weight_grads: WeightGrads = weight_grads_field()
    timeline_limit: int = Field(default=5000, ge=0, le=200000, description="At most this many predicted events returned.")

    @field_validator("recompute", mode="wrap")
    @classmethod
    def _recompute(cls, value: Any, handler: Any) -> Any:
        try:  # one message for the union, not one per alternative
            return handler(value)
        except ValidationError:
            raise spec_error(f"none, all, or a list of stage numbers from 0 (as [0, 2]); got {value!r}") from None

    @model_validator(mode="after")
    def _one_source(self) -> PlanCreate:
        if (self.profile_id is None) == (self.model is None):
            raise ValueError("give exactly one of 'profile_id' or 'model'")
        if total_workers(self.levels) > MAX_PLAN_WORKERS:
            raise ValueError(f"levels: at most {MAX_PLAN_WORKERS} workers in all (the product of the levels' workers)")
        return self


class PlanLevelStage(Stored):
    start: int = Field(description="First state of the stage (half-open range).")
    end: int
    replicas: int
    compute_s: float
    layers: list[str]


class PlanLevel(Stored):
    level: int = Field(description="1 = innermost.")
    workers: int
    bandwidth: float = Field(description="Bytes/s between this level's workers.")
    stages: list[PlanLevelStage]


class PlanStage(Stored):
    index: int
    layers: list[str] = Field(description="Layer names in topological order.")
    replicas: int
    workers: list[int] = Field(description="Global worker ranks, one per replica.")
    start_state: int
    end_state: int
    compute_s: float = Field(description="Forward + backward on one worker, per minibatch.")
    forward_s: float
    backward_s: float
    allreduce_s: float = Field(description="Data-parallel weight synchronisation per minibatch (0: one replica).")
    send_s: float = Field(description="Sending this stage's output activations (and their gradients back) per minibatch.")
    activation_bytes_out: float
    activation_bytes: float
    parameter_bytes: float
    in_flight: int = Field(description="Minibatches in flight at this stage.")
    memory_bytes: float
    time_s: float = Field(description="This stage's time per minibatch under the planner's cost model.")


class LengthHistogram(Stored):
    edges: list[float] = Field(description="Band edges, shortest to longest padded length.")
    counts: list[int] = Field(description="Batches whose padded length falls in each band.")


class PlanLengths(Stored):
    dim: int = Field(description="The input dimension whose size varies (the sequence).")
    measured: list[int] = Field(description="The lengths the profile measured.")
    batch_size: int = Field(description="Samples per batch whose padded lengths were counted.")
    histogram: LengthHistogram = Field(description="The batches' padded lengths.")
    mean_length: float = Field(description="The batches' mean padded length.")


class PlanOptions(Stored):
    straight: bool | None = None
    fewer_workers: bool | None = None
    activation_compression: float | None = None
    memory_bytes: float | None = None
    memory_constraint: bool | None = None
    max_states: int | None = None
    lengths: PlanLengths | None = Field(
        default=None,
        description="For a profile measured at several lengths (a task whose batches vary in length): the "
                    "lengths the plan assumed; the plan is costed on each layer's expected cost over their "
                    "histogram. Absent for a profile of one shape.")

class PlanData(Stored):
    """A plan (pipeboard.trainer.plan.Plan.to_dict(): docs/plan-format.md)."""

    format: str
    version: int
    method: str
    model: str
    state_graph: str = Field(description="`antichain` (exact states) or `linearised`.")
    states: int
    cluster: list[tuple[int, float]] = Field(description="[workers, bandwidth bytes/s] per level, innermost first.")
    total_workers: int
    workers_used: int
    predicted_time_s: float = Field(description="Time per minibatch of the slowest stage.")
    single_worker_time_s: float
    data_parallel_time_s: float
    speedup_vs_single: float | None = None
    speedup_vs_data_parallel: float | None = None
    data_parallel_speedup_vs_single: float | None = None
    noam: int = Field(description="Minibatches in flight at the input.")
    levels: list[PlanLevel]
    stages: list[PlanStage]
    options: PlanOptions = Field(default_factory=lambda: PlanOptions())
    exact: bool | None = None


class PredictedEvent(Stored):
    """One simulated action."""

    worker: int
    stage: int
    replica: int
    microbatch: int
    kind: str = Field(description="F, B, BI, W, step, send, recv, allreduce, ...")
    start: float
    end: float
    step: int


class Prediction(Stored):
    """The simulator's answer for a plan under its schedule (app/services/planning.py)."""

    iteration_time_s: float | None = Field(default=None, description="One simulated iteration, fill and drain included.")
    throughput: float | None = None
    throughput_unit: str | None = None
    samples_per_s: float | None = None
    bubble_fraction: float | None = None
    utilization: list[float] = Field(default_factory=list, description="Per worker.")
    peak_activations: list[int] = Field(default_factory=list, description="Per worker: microbatches stashed at once.")
    peak_memory_bytes: list[float] | None = None
    workers: int | None = None
    microbatches: int | None = None
    batch_weight_grads: bool | None = Field(default=None, description="Whether the weight gradients run in one pass per update.")
    cost_model: str | None = Field(default=None, description="`profile` (per-layer measurements) or `plan` (per-stage compute only).")
    steady_step_s: float | None = Field(default=None, description="Seconds per step back to back (profile cost model).")
    data_parallel_step_s: float | None = Field(default=None, description=(
        "Data parallelism's seconds per step on the same workers under the same cost model (profile cost model)."))
    stage_memory_bytes: list[int] | None = Field(default=None, description=(
        "Predicted peak bytes per (virtual) stage: the most of the workers holding it."))
    recompute_stages: list[int] = Field(default_factory=list, description="The stages that recompute their activations.")
    planner_time_per_minibatch_s: float | None = None
    data_parallel_time_per_minibatch_s: float | None = None
    single_worker_time_per_minibatch_s: float | None = None
    speedup_vs_data_parallel: float | None = Field(default=None, description=(
        "Data parallelism's time per step over the pipeline's (>1: the pipeline is predicted faster): "
        "`data_parallel_step_s / steady_step_s` under the profile cost model, else the planner's objective's ratio."))
    speedup_vs_single_worker: float | None = None
    timeline_total: int | None = Field(default=None, description="Simulated events before downsampling.")
    timeline: list[PredictedEvent] = Field(default_factory=list)


class RequestLevel(Stored):
    workers: int
    bandwidth: float


class PlanRequest(Stored):
    """What the plan was asked for: a what-if's body (`timeline_limit` aside), or a job's layout."""

    profile_id: int | None = None
    model: str | None = None
    model_args: dict[str, Any] | None = None
    batch_size: int | None = None
    levels: list[RequestLevel] | None = None
    workers: int | None = None
    memory_bytes: float | None = None
    method: str | None = None
    schedule: str | None = None
    microbatches: int | None = None
    chunks: int | None = None
    weight_grads: str | None = None
    recompute: str | list[int] | None = None
    optimizer: str | None = None


class PlanPublic(BaseModel):
    id: int
    profile_id: int
    request: PlanRequest
    plan: PlanData
    predicted: Prediction
    created_at: datetime | None = None


class PlanPending(BaseModel):
    """A what-if whose model has no cached profile yet: a worker profiles it (the job); once the job
    has succeeded, the same request plans at once."""

    status: Literal["profiling"] = "profiling"
    detail: str
    job: JobPublic = Field(description="The profiling job: follow it (GET /jobs/{id}, its events), then ask again.")
