"""Pipeline schedules as data, their validator, simulator and Chrome-trace export.

``build(name, stages, microbatches, ...)`` returns a ``Schedule`` (ordered actions per worker);
the runtime executes those lists unchanged, ``validate`` checks them and ``simulate`` predicts
their timeline. The schedules and what each can do are in the registry (``registry.py``:
``names()``, ``registry.get(name)``, ``register(...)``). See docs/schedules.md.

Note: the functions ``build``, ``validate`` and ``simulate`` share their names with their modules; import
other names from the modules with ``from pipeboard.trainer.schedule.simulate import SimResult``.
"""

from pipeboard.trainer.schedule.actions import Action, Kind, Schedule, ScheduleError, TimelineEvent, WorkerSpec
from pipeboard.trainer.schedule.build import build
from pipeboard.trainer.schedule.registry import ScheduleSpec, UnknownSchedule, names, register
from pipeboard.trainer.schedule.costs import StageCosts, costs_from_plan, costs_uniform
from pipeboard.trainer.schedule.simulate import SimResult, simulate
from pipeboard.trainer.schedule.trace import to_chrome_trace
from pipeboard.trainer.schedule.validate import ValidationReport, validate

__all__ = [
    "Action",
    "Kind",
    "SCHEDULES",
    "Schedule",
    "ScheduleError",
    "ScheduleSpec",
    "SimResult",
    "StageCosts",
    "TimelineEvent",
    "UnknownSchedule",
    "ValidationReport",
    "WorkerSpec",
    "build",
    "costs_from_plan",
    "costs_uniform",
    "names",
    "register",
    "simulate",
    "to_chrome_trace",
    "validate",
]


def __getattr__(name: str):
    if name == "SCHEDULES":  # the old constant: every registered schedule's name, now
        return names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
