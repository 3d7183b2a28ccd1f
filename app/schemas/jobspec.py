"""A job's specification (version 2): what `POST /jobs`, the new-job form and `pipeboard submit`
fill, what the database stores as it is, and what the run receives whole (app/services/runner.py
turns it into trainer/runtime/run_config.py's RunConfig, one file).

It is checked once, here, at the door: unknown fields and non-finite numbers are refused, and the
fields are checked against each other and against the schedule registry. The checks that need the
database (the model, the live hosts, a GPU) are `app/services/spec_checks.py`'s `check_spec`.

Sections, as a run's configuration is sectioned: `model` (what trains, on which data, in what
batches), `layout` (how it is split and scheduled), `length` (when it stops), `optimizer`,
`machine` (device and precision), `checkpoints`.

The flat version-1 body (`{"model": "mlp-digits", "schedule": "1f1b", "stop": {...}, ...}`) is still
accepted: `from_version_1` moves its fields into their sections before validation (migration 0005
does the same to stored rows), so a field v1 never had, e.g. a top-level `device`, is refused by
its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from pipeboard.app.schemas.common import (
    CUSTOM_SCHEDULE, DEFAULT_CHECKPOINT_EVERY, MAX_JOB_NODES, MAX_JOB_WORKERS, MAX_PLAN_WORKERS, NAME_PATTERN, Level,
    Method, ScheduleOrCustom, WeightGrads, _described, check_schedule_file, schedule_field, schedule_file_field,
    total_workers, weight_grads_field)
from pipeboard.trainer.schedule import registry as schedules

SPEC_VERSION = 2
# layout.recompute: a word, or the stage numbers that recompute (as `pipeboard train --recompute`)
Recompute = Literal["none", "all"] | Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=MAX_JOB_WORKERS * 16)]
DEFAULT_WORKERS = 2
DEFAULT_STEPS = 50


@dataclass(frozen=True)
class Run:
    """Marks a field the run receives as it is: the RunConfig field (trainer/runtime/run_config.py) it
    sets. app/services/run_setup.py's run_config copies every marked field, so an option the run
    takes is one field here (and its control in the form)."""

    field: str


def run_fields(section: type[BaseModel]) -> dict[str, str]:
    """A section's marked fields: its field name -> the RunConfig field."""
    return {name: m.field for name, info in section.model_fields.items() for m in info.metadata if isinstance(m, Run)}


def spec_error(message: str) -> PydanticCustomError:
    """A check across a section's fields: the 422 names the section (its location), the message the fields."""
    return PydanticCustomError("value_error", message)


class Section(BaseModel):
    # every section: unknown keys are refused by name, and so are NaN and the infinities
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ModelSection(Section):
    name: str = Field(min_length=1, max_length=300, description="A zoo model or a registered, validated model (GET /models).")
    args: dict[str, str | int | float | bool] = Field(default_factory=dict, description="Arguments of the task factory.")
    data: Annotated[str | None, Run("data")] = Field(default=None, max_length=300, description=(
        "Data location passed to the task factory as `data=`: relative to the model's code context, or absolute on "
        "the workers. Checked at submit time. Zoo models ship their own data, so usually empty."))
    batch_size: Annotated[int, Run("batch_size")] = Field(default=32, ge=1, le=65536, description="Samples per training step.")
    loader_workers: Annotated[int | None, Run("loader_workers")] = Field(
        default=None, ge=0, le=64, description="DataLoader worker processes per loading stage (default: the task's).")


class SplitStage(Section):
    """One stage of an explicit split: a plan's (and a tuner candidate's) stage, as it is."""

    layers: list[Annotated[str, Field(min_length=1, max_length=300)]] = Field(
        min_length=1, max_length=100_000, description="The stage's layer names (the profile's), in model order.")
    replicas: int = Field(default=1, ge=1, le=MAX_JOB_WORKERS, description="Worker processes that replicate it.")


class LayoutSection(Section):
    workers: int | None = Field(default=None, ge=1, le=MAX_JOB_WORKERS, description=(
        f"Worker processes (default {DEFAULT_WORKERS}); or give `levels`."))
    levels: list[Level] | None = Field(default=None, min_length=1, max_length=4,
                                       description="Cluster levels for the planner, innermost first.")
    memory_bytes: float | None = Field(default=None, gt=0, description="Memory per worker: the planner's constraint.")
    method: Method = Field(default="pipedream", description="How the planner splits the model.")
    schedule: Annotated[ScheduleOrCustom, Run("schedule")] = schedule_field(
        "The pipeline schedule the job trains with (`custom`: the job's own `schedule_file`).")
    schedule_file: Annotated[str | None, Run("schedule_csv")] = schedule_file_field("The job's own schedule.")
    microbatches: Annotated[int, Run("microbatches")] = Field(default=4, ge=1, le=1024, description="Microbatches per step; they divide `model.batch_size`.")
    chunks: Annotated[int, Run("chunks")] = Field(default=1, ge=1, le=16, json_schema_extra=_described(lambda: (
        f"Model chunks per worker ({schedules.either(schedules.having(chunks=True), quote='')}; others take 1).")))
    vertical_sync: Annotated[bool, Run("vertical_sync")] = Field(default=False, json_schema_extra=_described(lambda: (
        f"{schedules.either(schedules.having(vertical_sync=True), quote='')}: vertical sync of weight versions.")))
    weight_grads: Annotated[WeightGrads, Run("weight_grads")] = weight_grads_field()
    # what `pipeboard train --recompute` takes, as data: the tuner (trainer/tune) reads and writes it
    recompute: Annotated[Recompute, Run("recompute")] = Field(default="none", description=(
        "Activation recompute (torch.utils.checkpoint over a stage's layers): `none` (the default), `all` "
        "stages, or a list of stage numbers: the job's plan's stages in model order, from 0 (with chunks, its "
        "virtual stages, placed on the workers as the schedule does). A recomputing stage keeps only its input per "
        "microbatch in flight and reruns its forward in each backward: less memory, more time. A number "
        "the job's plan does not have (the planner may choose fewer stages than workers) fails the run "
        "naming it; `all` always fits."))
    # a tuner's choice (trainer/tune/tuned.py's job_layout): the job trains these stages, not a re-plan
    split: list[SplitStage] | None = Field(default=None, min_length=1, max_length=MAX_JOB_WORKERS * 16, description=(
        "The stages to train, in pipeline order, each its `layers` (the model's layer names) and `replicas`: the "
        "planner does not run. The layers must be the model's, each on one stage, no stage fed from a later one "
        "(checked against the model's profile when the job plans; a job fails naming this field otherwise); the "
        "replicas sum to the workers (with chunks: workers x chunks stages of one replica; data parallel: one stage, "
        "a replica per worker). `method` and `memory_bytes` (the planner's) are refused with it."))
    nodes: int = Field(default=1, ge=1, le=MAX_JOB_NODES, description=(
        "Worker hosts the job trains on at once, reserved together (each runs an equal share of the processes)."))

    _checked_file = field_validator("schedule_file")(check_schedule_file)

    @field_validator("recompute", mode="wrap")
    @classmethod
    def _recompute(cls, value: Any, handler: Any) -> Any:
        # one message for the union, not one per alternative
        try:
            return handler(value)
        except ValidationError:
            raise spec_error(f"none, all, or a list of stage numbers from 0 (as [0, 2]); got {value!r}") from None

    @model_validator(mode="after")
    def _consistent(self) -> LayoutSection:
        if (self.schedule == CUSTOM_SCHEDULE) != (self.schedule_file is not None):
            raise spec_error("schedule 'custom' and schedule_file go together: give both, or neither")
        if self.workers is not None and self.levels is not None:
            raise spec_error("give either 'workers' or 'levels', not both")
        if self.workers is None and self.levels is None:
            self.workers = DEFAULT_WORKERS
        if self.levels and total_workers(self.levels) > MAX_JOB_WORKERS:
            raise spec_error(f"levels: a job runs at most {MAX_JOB_WORKERS} worker processes in all")
        if self.processes % self.nodes:
            raise spec_error(f"nodes: {self.nodes} hosts cannot share the job's {self.processes} worker processes evenly")
        return self

    @property
    def processes(self) -> int:
        return self.workers if self.workers is not None else total_workers(self.levels)

    def schedule_to_run(self) -> str:
        """The registered schedule the job runs: ``schedule``, or its own file's (registered in
        this process under its content's name, trainer/schedule/torchcsv.py's register_text)."""
        if self.schedule_file is None:
            return self.schedule
        from pipeboard.trainer.schedule.torchcsv import register_text

        return register_text(self.schedule_file).name


class LengthSection(Section):
    """Exactly one of epochs, steps, target (the model's metric) or time_s."""

    epochs: Annotated[float | None, Run("epochs")] = Field(default=None, gt=0, le=10000)
    steps: Annotated[int | None, Run("steps")] = Field(default=None, ge=1, le=10_000_000)
    target: Annotated[float | None, Run("target")] = Field(default=None, description="Stop when the model's validation metric reaches this.")
    time_s: float | None = Field(default=None, gt=0, le=7 * 86400, description="Stop after this much training time.")
    eval_every: Annotated[int | None, Run("eval_every")] = Field(default=None, ge=1, le=1_000_000, description="Steps between validations (target rule).")

    @model_validator(mode="after")
    def _exactly_one(self) -> LengthSection:
        given = [k for k in ("epochs", "steps", "target", "time_s") if getattr(self, k) is not None]
        if len(given) != 1:
            raise spec_error(f"give exactly one of epochs, steps, target, time_s (got {given or 'none'})")
        return self


class OptimizerSection(Section):
    name: Annotated[Literal["adam", "adamw", "sgd"] | None, Run("optimizer")] = Field(default=None, description="Default: the model's.")
    lr: Annotated[float | None, Run("lr")] = Field(default=None, gt=0, le=100, description="Learning rate (default: the model's).")
    seed: Annotated[int, Run("seed")] = Field(default=0, ge=0, le=2**31 - 1)


class MachineSection(Section):
    device: Annotated[Literal["cpu", "cuda"], Run("device")] = Field(default="cpu", description=(
        "Where the stages run: `cpu`, or `cuda` (refused while no live worker reports a GPU)."))
    precision: Annotated[Literal["fp32", "bf16"], Run("precision")] = Field(default="fp32", description=(
        "`fp32`, or `bf16`: forwards under autocast, float32 master weights and optimizer state."))
    gpus_per_host: int | None = Field(default=None, ge=1, le=1024, description=(
        "cuda only: the GPUs a host gives the job when its stage processes share them (packed by predicted memory; "
        "stages on one GPU exchange tensors through host memory). Left out: one GPU for each process."))


class CheckpointSection(Section):
    every: Annotated[int, Run("checkpoint_every")] = Field(default=DEFAULT_CHECKPOINT_EVERY, ge=1, le=10_000_000, description=(
        "Training steps between checkpoints (kept under the data folder, the newest few); an attempt that fails "
        "resumes from the newest complete one."))
    max_attempts: int = Field(default=2, ge=1, le=10, description=(
        "Attempts in all, the first included: an attempt lost to a killed process, a dead worker or a lost host is "
        "retried automatically from the newest checkpoint until this many have run."))


class JobSpec(Section):
    """A train job (version 2). Fields left out take their defaults; unknown ones are refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra={"examples": [{
        "version": 2, "name": "digits-1f1b", "model": {"name": "mlp-digits", "batch_size": 32},
        "layout": {"workers": 2, "schedule": "1f1b", "microbatches": 4, "recompute": "none"}, "length": {"steps": 20},
        "machine": {"device": "cpu", "precision": "fp32"}}]})

    version: Literal[2] = Field(default=SPEC_VERSION, description="The specification's version.")
    name: str | None = Field(default=None, pattern=NAME_PATTERN)
    priority: int = Field(default=0, ge=-100, le=100, description="Higher runs first.")
    model: ModelSection
    layout: LayoutSection = Field(default_factory=lambda: LayoutSection())
    length: LengthSection = Field(default_factory=lambda: LengthSection(steps=DEFAULT_STEPS))
    optimizer: OptimizerSection = Field(default_factory=lambda: OptimizerSection())
    machine: MachineSection = Field(default_factory=lambda: MachineSection())
    checkpoints: CheckpointSection = Field(default_factory=lambda: CheckpointSection())

    @model_validator(mode="before")
    @classmethod
    def _version_1(cls, data: Any) -> Any:
        if isinstance(data, dict) and "version" not in data and not isinstance(data.get("model"), dict):
            return from_version_1(data)
        return data

    def problems(self) -> list[tuple[str, str]]:
        """(field, why) for each way the fields disagree with each other or with the schedule
        registry: checked once, at the door (app/services/spec_checks.py's check_spec, `pipeboard submit`),
        before anything is queued. Not a validator, so that a row stored before a check existed
        still loads."""
        out = []
        layout = self.layout
        if self.machine.gpus_per_host is not None and self.machine.device != "cuda":
            out.append(("machine.gpus_per_host", "only for machine.device cuda (GPUs shared by the job's processes)"))
        if self.model.batch_size % layout.microbatches:
            out.append(("layout.microbatches", f"{layout.microbatches} microbatches do not divide "
                                               f"model.batch_size {self.model.batch_size} evenly"))
        out += split_problems(layout)
        if isinstance(layout.recompute, list):
            # a plan has at most a stage per worker and chunk; data parallel one, on every worker
            stages = (1 if layout.schedule_file is None and schedules.is_data_parallel(layout.schedule)
                      else layout.processes * layout.chunks)
            if len(set(layout.recompute)) != len(layout.recompute):
                out.append(("layout.recompute", f"stage numbers repeat: {layout.recompute}"))
            elif any(s >= stages for s in layout.recompute):
                out.append(("layout.recompute", f"stage {max(layout.recompute)} is past the job's last possible stage, "
                                                f"{stages - 1} ({'data parallel: one stage' if stages == 1 and layout.processes > 1 else f'{layout.processes} workers x {layout.chunks} chunks'})"))
        if layout.schedule_file is not None:
            from pipeboard.trainer.schedule.torchcsv import loads

            written = loads(layout.schedule_file)
            wanted = (layout.processes, layout.chunks, layout.microbatches)
            if (written.ranks, written.chunks, written.microbatches) != wanted:
                out.append(("layout.schedule_file", f"written for {written.ranks} workers x {written.chunks} chunks and "
                                                    f"{written.microbatches} microbatches; the job has layout.workers "
                                                    f"{wanted[0]}, layout.chunks {wanted[1]}, layout.microbatches {wanted[2]}"))
            if layout.vertical_sync:
                out.append(("layout.vertical_sync", "a schedule file is synchronous: it has no vertical sync"))
            return out
        schedule = schedules.get(layout.schedule)
        if layout.chunks > 1 and not schedule.chunks:
            out.append(("layout.chunks", f"{layout.schedule} runs one chunk per worker (schedules that take chunks: "
                                         f"{schedules.either(schedules.having(chunks=True))})"))
        if layout.vertical_sync and not schedule.vertical_sync:
            out.append(("layout.vertical_sync", f"{layout.schedule} has no vertical sync (schedules that have it: "
                                                f"{schedules.either(schedules.having(vertical_sync=True))})"))
        return out


def split_problems(layout: LayoutSection) -> list[tuple[str, str]]:
    """(field, why) for a ``layout.split`` that cannot be the job's plan whatever the model: its
    shape against the workers, chunks, schedule and the planner's own fields."""
    split = layout.split
    if split is None:
        return []
    out = []
    if layout.method != "pipedream":  # the default, which a stored specification carries
        out.append(("layout.method", "layout.split gives the stages: the planner does not run (leave method out)"))
    if layout.memory_bytes is not None:
        out.append(("layout.memory_bytes", "layout.split gives the stages: the planner's memory cap does not apply "
                                           "(the tuner's --memory-per-worker chooses a split under a cap)"))
    if layout.levels is not None and len(layout.levels) > 1:
        out.append(("layout.split", "a split is laid out on one level of workers: give layout.workers or one level"))
    names = [n for st in split for n in st.layers]
    seen: set[str] = set()
    twice = next((n for n in names if n in seen or seen.add(n)), None)
    if twice is not None:
        out.append(("layout.split", f"layer {twice!r} is on more than one stage"))
    replicas = [st.replicas for st in split]
    processes = layout.processes
    data_parallel = layout.schedule_file is None and schedules.is_data_parallel(layout.schedule)
    if data_parallel and (len(split) != 1 or replicas[0] != processes):
        out.append(("layout.split", f"{layout.schedule} trains the whole model on each worker: one stage with "
                                    f"replicas {processes}; got {len(split)} stage(s), replicas {replicas}"))
    elif layout.chunks > 1 and (len(split) != processes * layout.chunks or any(r != 1 for r in replicas)):
        out.append(("layout.split", f"{layout.chunks} chunks on {processes} workers take {processes * layout.chunks} "
                                    f"stages of one replica; got {len(split)} stage(s), replicas {replicas}"))
    elif not data_parallel and layout.chunks == 1 and sum(replicas) != processes:
        out.append(("layout.split", f"its replicas {replicas} sum to {sum(replicas)}; the job has {processes} "
                                    "worker processes"))
    elif (not data_parallel and layout.schedule_file is None and any(r > 1 for r in replicas)
          and not schedules.get(layout.schedule).replication):
        out.append(("layout.split", f"{layout.schedule} runs one replica per stage; got replicas {replicas} "
                                    f"(schedules that replicate: {schedules.either(schedules.having(replication=True))})"))
    if isinstance(layout.recompute, list) and any(s >= len(split) for s in layout.recompute) and not data_parallel:
        out.append(("layout.recompute", f"stage {max(layout.recompute)} is past layout.split's last stage, {len(split) - 1}"))
    return out


# version 1's flat fields -> (section, field) in version 2
V1_FIELDS: dict[str, tuple[str, str]] = {
    "model": ("model", "name"), "model_args": ("model", "args"), "data": ("model", "data"),
    "batch_size": ("model", "batch_size"),
    **{k: ("layout", k) for k in ("workers", "levels", "memory_bytes", "method", "schedule", "microbatches",
                                  "weight_grads", "nodes")},
    "checkpoint_every": ("checkpoints", "every"), "max_attempts": ("checkpoints", "max_attempts"),
}
V1_HYPERPARAMETERS = {"lr": ("optimizer", "lr"), "optimizer": ("optimizer", "name"), "seed": ("optimizer", "seed"),
                      "eval_every": ("length", "eval_every"), "chunks": ("layout", "chunks"),
                      "vertical_sync": ("layout", "vertical_sync")}
V1_STOP = {k: ("length", k) for k in ("epochs", "steps", "target", "time_s")}


def from_version_1(flat: dict[str, Any]) -> dict[str, Any]:
    """A version-1 body as version 2. Keys it does not know stay where they were, under the name
    the client gave them (``hyperparameters.foo``), for the validation to refuse by that name."""
    out: dict[str, Any] = {"version": SPEC_VERSION}
    sections: dict[str, dict[str, Any]] = {}

    def put(where: tuple[str, str], value: Any) -> None:
        sections.setdefault(where[0], {})[where[1]] = value

    for key, value in flat.items():
        nested = {"hyperparameters": V1_HYPERPARAMETERS, "stop": V1_STOP}.get(key)
        if key in V1_FIELDS:
            put(V1_FIELDS[key], value)
        elif nested is not None and isinstance(value, dict):
            for inner, v in value.items():
                if inner in nested:
                    if v is not None:
                        put(nested[inner], v)
                else:
                    out[f"{key}.{inner}"] = v
        else:  # name, priority, or a field version 1 does not have either
            out[key] = value
    length = sections.get("length")
    if length is not None and not any(k in length for k in V1_STOP):  # eval_every alone: v1's default stop rule
        length["steps"] = DEFAULT_STEPS
    return {**out, **sections}


class CalibrateFor(Section):
    """Profile as a run of this shape would be: at its microbatch size, calibrated for its workers
    (the link, the runtime's overhead, pilot runs): what a what-if plans with (POST /plans)."""

    workers: int = Field(ge=1, le=MAX_PLAN_WORKERS, description="Worker processes of the run planned for.")
    batch_size: int = Field(ge=1, le=65536, description="The run's batch size.")
    microbatches: int = Field(ge=1, le=1024)
    weight_grads: WeightGrads = "batched"


class ProfileJobSpec(JobSpec):
    """A profiling job's (`POST /profiles`, or a what-if's without a cached profile): the model
    section says what is measured, on which device; ``repeats`` how many timed repetitions per
    layer; ``calibrate_for`` the run a what-if plans for."""

    repeats: int = Field(default=5, ge=1, le=100, description="Timed repetitions per layer.")
    calibrate_for: CalibrateFor | None = Field(default=None, description="A what-if's run: profiled as its job would be.")


def stored(spec: dict[str, Any]) -> JobSpec:
    """A job row's specification, typed (a profiling job's carries ``repeats``). The door's checks
    across fields (``problems``) are not run again: a row accepted before a check existed loads."""
    return (ProfileJobSpec if "repeats" in spec else JobSpec).model_validate(spec)
