"""Pipeline schedules as data, their validator, simulator and Chrome-trace export.

``build(name, stages, microbatches, ...)`` returns a ``Schedule`` (ordered actions per worker);
the runtime executes those lists unchanged and ``simulate`` predicts their timeline.
"""

from trainer.schedule.actions import Action, Kind, Schedule, ScheduleError, TimelineEvent, WorkerSpec
from trainer.schedule.build import SCHEDULES, build, names

__all__ = [
    "Action",
    "Kind",
    "SCHEDULES",
    "Schedule",
    "ScheduleError",
    "TimelineEvent",
    "WorkerSpec",
    "build",
    "names",
]
