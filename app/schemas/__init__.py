"""Pydantic shapes of the REST API: `XCreate` for what clients send, `XPublic` for what they get.

Validation lives here so that bad input becomes a 422 naming the field before any route code
runs; the few checks that need the database or the trainer (unknown model, invalid schedule for
a plan) happen in `app/services/` and raise `ServiceError`, which the routes turn into 4xx.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Callable, Generic, Literal, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError, core_schema

from pipeboard.trainer.schedule import registry as schedules

from pipeboard.app.schemas.common import (  # noqa: F401  (re-exported: `from pipeboard.app.schemas import X`)
    DEFAULT_CHECKPOINT_EVERY, MAX_JOB_NODES, MAX_JOB_WORKERS, MAX_PLAN_WORKERS, NAME_PATTERN, Level, Method,
    ScheduleName, WeightGrads, _described, schedule_description, schedule_field, total_workers, weight_grads_description,
    weight_grads_field)
from pipeboard.app.schemas.jobspec import JobSpec, ProfileJobSpec  # noqa: F401

T = TypeVar("T")

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
Scope = Literal["read", "write", "admin"]
MAX_TOKEN_LIFETIME_S = 10 * 365 * 86400  # an expiry further out is no expiry



class Page(BaseModel, Generic[T]):
    """Every list endpoint answers with one page and the total count matching the filter."""

    data: list[T]
    count: int


class Message(BaseModel):
    detail: str


class ValidationErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ValidationFailed(BaseModel):
    """The 422 body (pipeboard.app.main's handler): one message naming the field(s), plus the details."""

    detail: str
    errors: list[ValidationErrorItem] = Field(default_factory=list)


# --- models -----------------------------------------------------------------------------------


FACTORY_PATTERN = r"^(?:[A-Za-z_][A-Za-z0-9_.]*|[A-Za-z0-9_.][A-Za-z0-9_./-]*\.py):[A-Za-z_][A-Za-z0-9_]*$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class ModelCreate(BaseModel):
    """Register a task factory: an import path installed on the workers, or a path inside an
    uploaded code context (POST /contexts). A worker validates it before it can run."""

    # An example the API accepts as it stands: a task factory installed with pipeboard itself (one in
    # a code context names the context's sha256, which only an upload makes: docs/api.md).
    model_config = ConfigDict(json_schema_extra={"examples": [{"name": "my-mlp", "source": "pipeboard.trainer.zoo.digits:mlp_digits",
                                                                "config": {"hidden": 64}}]})

    name: str = Field(pattern=NAME_PATTERN, description="Unique name to refer to the model by (jobs' `model`).")
    source: str = Field(
        min_length=3,
        max_length=300,
        pattern=FACTORY_PATTERN,
        description="The task factory: `package.module:function` (importable on the workers, or from the "
                    "context's top folder) or `path/inside/context.py:function` (needs `context`). It returns "
                    "a pipeboard.trainer.Task.",
    )
    context: str | None = Field(default=None, pattern=SHA256_PATTERN,
                                description="SHA-256 of an uploaded code context (POST /contexts) the factory lives in.")
    config: dict[str, Any] = Field(default_factory=dict, description="Model arguments passed to the factory.")
    data: str | None = Field(default=None, max_length=500,
                             description="Data location passed to the factory as `data=` when validating (a path "
                                         "relative to the context's top folder, or absolute on the workers).")


class ModelPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int | None = Field(description="Database id; null for zoo models that were never registered.")
    name: str
    source: str
    kind: str = Field(description="`zoo`, `import` (an installed import path) or `context` (an uploaded project).")
    description: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    context: str | None = Field(default=None, description="SHA-256 of the model's code context.")
    data: str | None = None
    status: Literal["validating", "ready", "failed"] = Field(
        default="ready", description="`validating` while a worker builds, checks and splits it; `ready`; `failed` "
                                     "(`message` says why). Zoo models are always ready.")
    message: str = Field(default="", description="What validation found, or why it failed.")
    layers: int | None = None
    created_at: datetime | None = None


# --- code contexts ---------------------------------------------------------------------------


class ContextPublic(BaseModel):
    sha256: str = Field(description="SHA-256 of the archive's bytes: its id.")
    filename: str
    kind: Literal["tar.gz", "zip"]
    size: int = Field(description="Archive bytes.")
    files: int = Field(description="Regular files in it.")
    unpacked_bytes: int
    created_at: datetime | None = None


# --- profiles ---------------------------------------------------------------------------------


class ProfileCreate(BaseModel):
    """Profile a model on the worker (a Celery task); poll `GET /profiles/{id}` for the result."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"model": "mlp-digits", "batch_size": 32}]})

    model: str = Field(min_length=1, max_length=300, description="A zoo name or a registered model's name.")
    model_args: dict[str, str | int | float | bool] = Field(default_factory=dict, description="Arguments of the model.")
    batch_size: int = Field(default=32, ge=1, le=65536)
    device: Literal["cpu", "cuda"] = "cpu"
    repeats: int = Field(default=5, ge=1, le=100, description="Timed repetitions per layer.")


class LayerRow(BaseModel):
    name: str
    desc: str = ""
    forward_ms: float
    backward_ms: float
    activation_bytes: float
    parameter_bytes: float


class ProfilePublic(BaseModel):
    id: int
    name: str
    model_id: int | None = None
    batch_size: int | None = None
    status: str = Field(description="`ready` once data is present, `pending` while being profiled, `failed`.")
    error: str | None = None
    created_at: datetime | None = None
    total_forward_ms: float = 0.0
    total_backward_ms: float = 0.0
    layers: list[LayerRow] = Field(default_factory=list)
    data: dict[str, Any] | None = Field(default=None, description="The profile JSON (pipeboard.profile v1).")


# --- schedules --------------------------------------------------------------------------------


class SchedulePublic(BaseModel):
    """A registered schedule and what it can do (trainer/schedule/registry.py's ScheduleSpec)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "name": "pipedream", "description": "Asynchronous 1F1B without a flush: weight stashing, one update per batch (PipeDream).",
        "default": False, "synchronous": False, "replication": True, "chunks": False, "default_chunks": 1,
        "weight_grads": ["batched", "immediate"], "vertical_sync": True, "needs_split_backward": False,
        "data_parallel": False}]})

    name: ScheduleName
    description: str = Field(description="One line, for help texts and the dashboard's form.")
    default: bool = Field(description="The schedule a job or plan gets when it names none.")
    synchronous: bool = Field(description="One weight update per iteration of its microbatches (a flush); false: "
                                          "asynchronous, an update per batch with weight stashing (pipedream).")
    replication: bool = Field(description="Stages may have several replicas.")
    chunks: bool = Field(description="Takes `chunks` > 1 model chunks per worker (one worker per stage).")
    default_chunks: int = Field(description="The chunks a job runs with when it asks for 1.")
    weight_grads: list[WeightGrads] = Field(description="The `weight_grads` modes it honours; empty: it ignores the setting.")
    vertical_sync: bool = Field(description="Takes `hyperparameters.vertical_sync`.")
    needs_split_backward: bool = Field(description="Its backwards are always split into input and weight gradients.")
    data_parallel: bool = Field(description="The whole model on every worker: one stage, `workers` replicas of it.")


# --- plans ------------------------------------------------------------------------------------



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
    memory_bytes: float | None = Field(default=None, gt=0, description="Memory per worker; enables the memory constraint.")
    method: Method = "pipedream"
    schedule: ScheduleName = schedule_field("Schedule simulated for the predicted timeline.")
    microbatches: int = Field(default=8, ge=1, le=1024, description="Microbatches per simulated iteration.")
    chunks: int = Field(default=1, ge=1, le=16, json_schema_extra=_described(lambda: (
        f"Model chunks per worker ({schedules.either(schedules.having(chunks=True), quote='')}).")))
    weight_grads: WeightGrads = weight_grads_field()
    timeline_limit: int = Field(default=5000, ge=0, le=200000, description="At most this many predicted events returned.")

    @model_validator(mode="after")
    def _one_source(self) -> PlanCreate:
        if (self.profile_id is None) == (self.model is None):
            raise ValueError("give exactly one of 'profile_id' or 'model'")
        if total_workers(self.levels) > MAX_PLAN_WORKERS:
            raise ValueError(f"levels: at most {MAX_PLAN_WORKERS} workers in all (the product of the levels' workers)")
        return self


class PlanPublic(BaseModel):
    id: int
    profile_id: int
    request: dict[str, Any]
    plan: dict[str, Any] = Field(description="pipeboard.trainer.plan.Plan.to_dict()")
    predicted: dict[str, Any] = Field(description="Simulator output: iteration_time_s, throughput, bubble_fraction, utilization, timeline.")
    created_at: datetime | None = None


# --- jobs -------------------------------------------------------------------------------------


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


class FidelityTerm(BaseModel):
    factor: float | None = Field(description="Measured over predicted seconds per action (median over stages); null where the prediction was 0.")
    predicted_s: float = Field(description="Predicted seconds per action (median over stages).")
    measured_s: float = Field(description="Measured seconds per action (median over stages).")
    moved: bool = Field(description="Whether any stage's factor is more than 5% away from 1 (or a term predicted 0 was measured).")
    stages: list[dict[str, Any]] = Field(description="Per stage: name, stage, predicted_s, measured_s, factor, moved, samples.")


class Fidelity(BaseModel):
    """A train job's predicted against measured time per step (docs/api.md, "Prediction fidelity")."""

    predicted_step_s: float | None = Field(description="The plan's predicted seconds per step (see `basis`).")
    basis: Literal["steady_step_s", "iteration_time_s"] | None = Field(
        description="`steady_step_s`: the simulator's steady state under the profile's costs; `iteration_time_s`: one "
                    "simulated iteration, fill and drain included (plans without the profile's measurements).")
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


class JobPublic(BaseModel):
    id: int
    name: str
    status: JobStatus
    priority: int
    queue_position: int | None = Field(default=None, description="1 = next to run; null unless queued.")
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
    summary: dict[str, Any] | None = Field(default=None, description=(
        "The run's summary (samples_per_s, step_s, final metric, ...); a train job's carries `fidelity` when it succeeds."))
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


# --- tokens -----------------------------------------------------------------------------------


class TokenCreate(BaseModel):
    """A new token; `expires_in_s` or `expires_at` (not both) make it stop working at that time."""

    model_config = ConfigDict(strict=True, json_schema_extra={"examples": [
        {"name": "ci", "scope": "write", "expires_in_s": 30 * 86400},
        {"name": "viewer", "scope": "read"},
    ]})

    name: str = Field(pattern=NAME_PATTERN, description="What the token is for, e.g. ci.")
    scope: Scope = Field(default="read", description="`read`: GET routes; `write`: every route but token management; "
                                                     "`admin`: everything.")
    expires_in_s: int | None = Field(default=None, ge=1, le=MAX_TOKEN_LIFETIME_S,
                                     description="Seconds from now after which the token stops working.")
    expires_at: AwareDatetime | None = Field(default=None, strict=False,
                                             description="When the token stops working (ISO 8601 with a time zone).")

    @model_validator(mode="after")
    def _one_expiry(self) -> TokenCreate:
        if self.expires_in_s is not None and self.expires_at is not None:
            raise ValueError("give at most one of 'expires_in_s' or 'expires_at'")
        if self.expires_at is not None:
            ahead = self.expires_at - datetime.now(timezone.utc)
            if ahead <= timedelta(0):
                raise ValueError("expires_at: must be in the future")
            if ahead > timedelta(seconds=MAX_TOKEN_LIFETIME_S):
                raise ValueError(f"expires_at: at most {MAX_TOKEN_LIFETIME_S // 86400} days ahead")
        return self

    def expiry(self) -> datetime | None:
        """When the token expires, in UTC; None for never."""
        if self.expires_in_s is not None:
            return datetime.now(timezone.utc) + timedelta(seconds=self.expires_in_s)
        return self.expires_at.astimezone(timezone.utc) if self.expires_at is not None else None


class TokenPublic(BaseModel):
    id: int
    name: str
    scope: Scope
    prefix: str
    created_at: datetime | None = None
    last_used_at: datetime | None = None
    expires_at: datetime | None = Field(default=None, description="When it stops working; null: never.")
    revoked: bool = False


class TokenCreated(TokenPublic):
    token: str = Field(description="The secret, shown once; send it as `Authorization: Bearer <token>`.")


class Me(BaseModel):
    authenticated: bool
    name: str | None = None
    scope: Scope | None = None
    expires_at: datetime | None = Field(default=None, description="When the token stops working; null: never.")
    read_auth: bool = Field(description="Whether reads need a token on this server.")
    write_auth: bool = Field(description="Whether writes need a write token on this server: always, but with "
                                         "PIPEBOARD_AUTH=off (a loopback-only server).")
