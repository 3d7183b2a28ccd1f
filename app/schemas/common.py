"""Shapes shared by several resources: pages, error bodies, schedule names from the registry,
planner methods, cluster levels, names, and the limits on what one job may ask for."""

from __future__ import annotations

from typing import Annotated, Any, Callable, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_serializer
from pydantic_core import PydanticCustomError, core_schema

from pipeboard.trainer.schedule import registry as schedules

Method = Literal["pipedream", "uniform", "time", "params", "dp"]
WeightGrads = Literal["batched", "immediate"]


# --- schedules: from the registry (trainer/schedule/registry.py), read when a request is
# validated and when the OpenAPI document is made, so a schedule registered after this module
# was imported counts too -------------------------------------------------------------------------


CUSTOM_SCHEDULE = "custom"  # a job's or a what-if's own schedule file (layout.schedule_file / schedule_file)


class _RegisteredSchedule:
    """Validates a schedule name against the registry (plus `also`); its JSON schema is that enum."""

    also: tuple[str, ...] = ()

    @classmethod
    def _check(cls, value: str) -> str:
        if value not in cls.also and not schedules.listed(value):
            raise PydanticCustomError("enum", "Input should be {expected}",
                                      {"expected": schedules.either((*schedules.names(), *cls.also))})
        return value

    @classmethod
    def __get_pydantic_core_schema__(cls, _source: Any, _handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(cls._check, core_schema.str_schema())

    @classmethod
    def __get_pydantic_json_schema__(cls, _schema: Any, _handler: Any) -> dict[str, Any]:
        return {"type": "string", "enum": [*schedules.names(), *cls.also]}


class _RegisteredOrCustomSchedule(_RegisteredSchedule):
    """A registered schedule's name, or ``custom``: the request's own torch schedule file."""

    also = (CUSTOM_SCHEDULE,)


ScheduleName = Annotated[str, _RegisteredSchedule]
ScheduleOrCustom = Annotated[str, _RegisteredOrCustomSchedule]
MAX_SCHEDULE_FILE_CHARS = 1_000_000  # a torch schedule file's text: ~100k actions


def check_schedule_file(text: str | None) -> str | None:
    """A schedule file's text checked as `pipeboard schedule import` checks one (a deadlock, a
    missing action: one line naming the rank and the action), for the 422 naming the field."""
    from pipeboard.trainer.schedule.actions import ScheduleError
    from pipeboard.trainer.schedule.torchcsv import loads

    if text is not None:
        try:
            loads(text)
        except ScheduleError as exc:
            raise PydanticCustomError("value_error", "{why}", {"why": str(exc)}) from None
    return text


def schedule_file_field(what: str) -> Any:
    return Field(default=None, max_length=MAX_SCHEDULE_FILE_CHARS, description=(
        f"{what} A schedule as torch's `_dump_csv` writes it (one row per worker, actions such as `0F3`, `1I2`, "
        "`1W2`, `(0F3;3B1)OVERLAP_F_B`; torchtitan's `pipeline_parallel_schedule_csv`), as text: with `schedule` "
        "`custom`, the run follows it. Checked here: a deadlock or a missing action is a 422 naming the rank and "
        "the action."))


def _described(text: Callable[[], str]) -> Callable[[dict[str, Any]], None]:
    """A field's ``json_schema_extra`` that writes its description when the schema is made."""

    def extra(schema: dict[str, Any]) -> None:
        schema["description"] = text()

    return extra


def _ignoring() -> str:
    return schedules.either(schedules.having(weight_grads=()), quote="", conj="and")


def schedule_description(what: str) -> str:
    return (f"{what} One of the registered schedules (`GET /schedules` says what each can do): "
            + "; ".join(f"`{s.name}`: {s.description.rstrip('.')}" for s in schedules.specs()) + ".")


def weight_grads_description() -> str:
    return (
        "How backwards compute weight gradients (`pipeboard train --weight-grads`). `batched` (default): each "
        "backward computes input gradients only, and one pass right before each weight update computes the weight "
        "gradients of all its microbatches at once (one matmul per Linear layer; faster on small microbatches); "
        f"`immediate`: each backward computes both. Same gradients up to float rounding. {_ignoring()} ignore it."
    )


def schedule_field(what: str) -> Any:
    return Field(default=schedules.DEFAULT, json_schema_extra=_described(lambda: schedule_description(what)))


def weight_grads_field() -> Any:
    return Field(default="batched", json_schema_extra=_described(weight_grads_description))

# Names are free text in the database but short, printable identifiers in the API.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\- ]{0,119}$"


MAX_PLAN_WORKERS = 4096  # what the inline what-if answers quickly
MAX_JOB_WORKERS = 64  # local processes a job may start
MAX_JOB_NODES = 16  # worker hosts one job may span
DEFAULT_CHECKPOINT_EVERY = 20  # steps: a lost attempt redoes at most this many


def total_workers(levels: list[Level] | None) -> int:
    n = 1
    for level in levels or []:
        n *= level.workers
    return n


class Level(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON numbers only: `true` is not 1, "4" is not 4

    workers: int = Field(ge=1, le=65536, description="Workers at this level (level 1 innermost).")
    bandwidth: float = Field(gt=0, le=1e15, description="Bandwidth between workers of this level, bytes/s.")


T = TypeVar("T")

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


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


class Stored(BaseModel):
    """What the service computed and stored (a plan, a prediction, a run's summary), described field
    by field for the OpenAPI, and answered as it was stored: a field it does not have is not added
    as null, and one the trainer adds later passes through rather than being dropped."""

    model_config = ConfigDict(extra="allow")

    @model_serializer(mode="wrap")
    def _as_stored(self, handler):  # no return annotation: the schema stays the fields' own
        data = handler(self)
        given = self.model_fields_set | set(self.model_extra or {})
        return {k: v for k, v in data.items() if k in given}
