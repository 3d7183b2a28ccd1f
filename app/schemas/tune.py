"""The tuner (`POST /tune`): a ranked choice of split, schedule, microbatches and recompute."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeboard.app.schemas.common import MAX_PLAN_WORKERS, ScheduleName
from pipeboard.app.schemas.jobs import JobPublic

MAX_TUNE_WORKERS = 64  # every candidate is simulated inline: a search this large answers in seconds


class TuneCreate(BaseModel):
    """What to tune: the model (by its stored profiles or its name), the workers and the batch."""

    model_config = ConfigDict(strict=True, json_schema_extra={"examples": [
        {"model": "mlp", "workers": 2, "batch_size": 32, "microbatches": [2, 4, 8],
         "memory_per_worker_bytes": 200000000}]})

    profile_ids: list[int] | None = Field(default=None, min_length=1, max_length=8, description=(
        "Stored profiles of one model, one per microbatch size (a simulated microbatch costs what its profile "
        "measured): counts whose microbatch size none has are not tried. Or give `model`."))
    model: str | None = Field(default=None, min_length=1, max_length=300, description=(
        "A zoo or registered model: its cached profiles at each microbatch size `batch_size / microbatches` "
        "are used; one not cached yet is profiled by a worker first (202 with the job; ask again)."))
    model_args: dict[str, Any] = Field(default_factory=dict, description="With `model`: its arguments.")
    workers: int = Field(ge=1, le=min(MAX_TUNE_WORKERS, MAX_PLAN_WORKERS), description="Worker processes of the run.")
    batch_size: int = Field(ge=1, le=65536, description="Samples per training step.")
    memory_per_worker_bytes: float | None = Field(default=None, gt=0, description=(
        "Cap per worker: only candidates predicted under it are chosen; a cap nothing fits is a 422 naming the "
        "smallest memory any candidate needs."))
    microbatches: list[int] = Field(default=[1, 2, 4, 8, 16], min_length=1, max_length=8, description=(
        "Microbatch counts to try (those dividing `batch_size`)."))
    schedules: list[ScheduleName] | None = Field(default=None, min_length=1, max_length=32, description=(
        "Schedules to try; default every registered one (data parallelism included)."))
    bandwidth: float = Field(default=5e9, gt=0, description="Bytes/s between workers where the profile measured no link.")

    @model_validator(mode="after")
    def _one_source(self) -> TuneCreate:
        if (self.profile_ids is None) == (self.model is None):
            raise ValueError("give exactly one of 'profile_ids' or 'model'")
        if any(m < 1 or m > 1024 for m in self.microbatches):
            raise ValueError("microbatches: counts from 1 to 1024")
        return self


class TunePublic(BaseModel):
    """The ranked candidates: those that fit the cap by predicted time per sample, then those that
    do not (with why), each a plan (method and per stage its layers and replicas), `schedule`,
    `chunks`, `microbatches`, `recompute` per stage, `predicted_step_s`, `predicted_memory_bytes`
    (the fullest worker) and `measured_step_s` (null: the API does not run them; `pipeboard tune
    --verify` does)."""

    choice: dict[str, Any] = Field(description="The first candidate: the fastest per sample that fits.")
    candidates: list[dict[str, Any]] = Field(description="Every candidate, best first.")
    skipped: list[dict[str, str]] = Field(description="Combinations the runtime cannot run, with why.")
    memory_per_worker_bytes: float | None
    verified: int = Field(description="How many candidates were measured (0 here).")
    run: dict[str, Any] = Field(description="The tuned model and cluster: a tune file for `pipeboard train --tuned`.")
    job_layout: dict[str, Any] = Field(description=(
        "The choice as a job's `layout` (method, schedule, microbatches, chunks, recompute, workers), to submit "
        "with `model` {name, args, batch_size}."))
    profile_ids: list[int] = Field(description="The profiles the search used.")


class TunePending(BaseModel):
    detail: str
    job: JobPublic
