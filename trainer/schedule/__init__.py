"""Pipeline schedules as data, their validator, simulator and Chrome-trace export.

The package exports:

- ``build(name, stages, microbatches, ...)`` (``builder.py``): a ``Schedule``, the ordered
  actions of each worker, which the runtime executes unchanged;
- ``validate(schedule)`` and ``ValidationReport`` (``validator.py``): whether the lists can run,
  and what they keep in memory;
- ``simulate(schedule, costs)`` and ``SimResult`` (``simulator.py``): their predicted timeline;
- ``StageCosts``, ``costs_uniform``, ``costs_from_plan`` (``action_costs.py``): what each action
  costs;
- ``to_chrome_trace`` (``trace.py``);
- ``Action``, ``Kind``, ``Schedule``, ``ScheduleError``, ``TimelineEvent``, ``WorkerSpec``
  (``actions.py``);
- from the registry (``registry.py``), which holds the schedules and what each can do:
  ``ScheduleSpec``, ``UnknownSchedule``, ``names()``, ``register(...)``, and ``SCHEDULES``
  (every registered name, read when asked); ``registry.get(name)`` looks one up.

See docs/schedules.md.
"""

from pipeboard.trainer.schedule.actions import Action, Kind, Schedule, ScheduleError, TimelineEvent, WorkerSpec
from pipeboard.trainer.schedule.builder import build
from pipeboard.trainer.schedule.registry import ScheduleSpec, UnknownSchedule, names, register
from pipeboard.trainer.schedule.action_costs import StageCosts, costs_from_plan, costs_uniform
from pipeboard.trainer.schedule.simulator import SimResult, simulate
from pipeboard.trainer.schedule.trace import to_chrome_trace
from pipeboard.trainer.schedule.validator import ValidationReport, validate

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
