"""`/plans`: plan a profile for a cluster and predict its timeline (the dashboard's what-if)."""

from __future__ import annotations

from fastapi import APIRouter

from pipeboard.app.api.deps import SessionDep
from pipeboard.app.schemas import Message, ValidationFailed
from pipeboard.app.api.common import AUTH_RESPONSES, NOT_FOUND, PlanId, ServiceRoute
from pipeboard.app.api.security import ReadAccess, WriteAccess
from pipeboard.app.schemas import PlanCreate, PlanPublic
from pipeboard.app.services import plans

router = APIRouter(prefix="/plans", tags=["plans"], route_class=ServiceRoute, responses=AUTH_RESPONSES)


@router.post(
    "",
    response_model=PlanPublic,
    status_code=201,
    summary="Plan and simulate (what-if)",
    description=(
        "Partitions a profile over the cluster `levels` (innermost first: workers and bandwidth in bytes/s) "
        "with the chosen planner `method`, simulates `schedule` with `microbatches` (and `weight_grads`, as a job "
        "would run it), and returns the plan, the "
        "predicted timeline, and throughput against data parallel on the same workers. Give `profile_id`, or "
        "`model` to use (and on first use, measure) that model's cached profile. Answers inline."
    ),
    responses={404: {"model": Message, "description": "No such profile."}, 422: {"model": ValidationFailed, "description": "Invalid cluster, schedule or model (the message names the field)."}},
)
def create_plan(body: PlanCreate, session: SessionDep, _: WriteAccess) -> PlanPublic:
    return plans.to_public(plans.create(session, body))


@router.get("/{plan_id}", response_model=PlanPublic, summary="Get a plan", description="A stored plan with its prediction.", responses=NOT_FOUND)
def get_plan(plan_id: PlanId, session: SessionDep, _: ReadAccess) -> PlanPublic:
    return plans.to_public(plans.get(session, plan_id))
