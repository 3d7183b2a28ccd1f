"""`/schedules`: the schedule registry (trainer/schedule/registry.py), what each schedule can do."""

from __future__ import annotations

from fastapi import APIRouter

from pipeboard.app.api.common import AUTH_RESPONSES, Limit, Offset, ServiceRoute
from pipeboard.app.api.security import ReadAccess
from pipeboard.app.schemas import Page, SchedulePublic
from pipeboard.trainer.schedule import registry

router = APIRouter(prefix="/schedules", tags=["schedules"], route_class=ServiceRoute, responses=AUTH_RESPONSES)
registry.names()  # a PIPEBOARD_SCHEDULES module that cannot be imported stops the service here, at its start


def public(spec: registry.ScheduleSpec) -> SchedulePublic:
    return SchedulePublic(**spec.to_dict(), default=spec.name == registry.DEFAULT)


@router.get(
    "",
    response_model=Page[SchedulePublic],
    summary="List schedules",
    description=(
        "Every registered schedule, in registration order (the built-ins first, then those named in "
        "`PIPEBOARD_SCHEDULES`), with its one-line description and capabilities: synchronous or not, "
        "replication, model chunks, the weight-gradient modes it honours, vertical sync, data parallel. "
        "A job's or plan's `schedule` is one of these names; the dashboard's new-job form is filled from here. "
        "A job may also name `custom` with its own `layout.schedule_file` (torch's schedule CSV): a choice only "
        "with that file, so it is not listed here (the job's schema lists it after these)."
    ),
)
def list_schedules(_: ReadAccess, offset: Offset = 0, limit: Limit = 100) -> Page[SchedulePublic]:
    specs = registry.specs()
    return Page(data=[public(s) for s in specs[offset:offset + limit]], count=len(specs))
