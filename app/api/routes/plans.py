"""`/plans`: plan a profile for a cluster and predict its timeline (the dashboard's what-if)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from pipeboard.app.api.deps import SessionDep
from pipeboard.app.schemas import Message, ValidationFailed
from pipeboard.app.api.common import AUTH_RESPONSES, NOT_FOUND, PlanId, ServiceRoute
from pipeboard.app.api.security import ReadAccess, WriteAccess
from pipeboard.app.models import Job
from pipeboard.app.schemas import PlanCreate, PlanPending, PlanPublic
from pipeboard.app.services import jobs, plans

router = APIRouter(prefix="/plans", tags=["plans"], route_class=ServiceRoute, responses=AUTH_RESPONSES)


@router.post(
    "",
    response_model=PlanPublic,
    status_code=201,
    summary="Plan and simulate (what-if)",
    description=(
        "Partitions a profile over the cluster `levels` (innermost first: workers and bandwidth in bytes/s) "
        "with the chosen planner `method`, simulates `schedule` with `microbatches` (and `weight_grads`, as a job "
        "would run it), and returns the plan, the predicted timeline, and throughput against data parallel on the "
        "same workers (201). Give `profile_id`, or `model` to use that model's cached profile, measured as its job "
        "would be. A model without one (a zoo model, or a registered one once it is `ready`) is profiled by a "
        "worker, never in this process: the answer is then 202 with the profiling job; follow it "
        "(`GET /jobs/{id}` or its events) and ask again once it has succeeded. A second what-if for the same "
        "model, arguments and run gets the same job."
    ),
    responses={
        202: {"model": PlanPending, "description": "The model is being profiled on a worker: follow `job`, then ask again."},
        404: {"model": Message, "description": "No such profile."},
        422: {"model": ValidationFailed, "description": "Invalid cluster, schedule or model (the message names the field)."},
    },
)
def create_plan(body: PlanCreate, session: SessionDep, principal: WriteAccess) -> PlanPublic | JSONResponse:
    made = plans.create(session, body, submitted_by=principal.name, owner_id=principal.user_id)
    if isinstance(made, Job):
        pending = PlanPending(detail=f"profiling {body.model} on a worker (job {made.id}); ask again once it has "
                                     "succeeded", job=jobs.to_public(session, made))
        return JSONResponse(pending.model_dump(mode="json"), status_code=202)
    return plans.to_public(made)


@router.get("/{plan_id}", response_model=PlanPublic, summary="Get a plan", description="A stored plan with its prediction.", responses=NOT_FOUND)
def get_plan(plan_id: PlanId, session: SessionDep, _: ReadAccess) -> PlanPublic:
    return plans.to_public(plans.get(session, plan_id))
