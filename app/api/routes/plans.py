"""`/plans`: plan a profile for a cluster and predict its timeline (the dashboard's what-if)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from pipeboard.app.api import ownership
from pipeboard.app.api.deps import SessionDep
from pipeboard.app.schemas import Message, ValidationFailed
from pipeboard.app.api.common import AUTH_RESPONSES, NOT_FOUND, PlanId, ServiceRoute
from pipeboard.app.api.security import ReadAccess, WriteAccess
from pipeboard.app.models import Job, Profile
from pipeboard.app.services.errors import NotFound
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
        "model, arguments and run gets the same job. The plan is its requester's: another user hears 404 for it "
        "(an admin sees every plan), and may plan only profiles and models they can see."
    ),
    responses={
        202: {"model": PlanPending, "description": "The model is being profiled on a worker: follow `job`, then ask again."},
        404: {"model": Message, "description": "No such profile."},
        422: {"model": ValidationFailed, "description": "Invalid cluster, schedule or model (the message names the field)."},
    },
)
def create_plan(body: PlanCreate, session: SessionDep, principal: WriteAccess) -> PlanPublic | JSONResponse:
    if body.profile_id is not None:  # another user's profile: 404, as a missing one
        prof = session.get(Profile, body.profile_id)
        if prof is None or not ownership.profile_visible(session, principal, prof):
            raise NotFound("profile", body.profile_id)
    elif body.model is not None:
        ownership.check_job_model(session, principal, body.model, field="model")  # another user's model reads as unknown
    made = plans.create(session, body, submitted_by=principal.name, owner_id=principal.user_id)
    if isinstance(made, Job):
        pending = PlanPending(detail=f"profiling {body.model} on a worker (job {made.id}); ask again once it has "
                                     "succeeded", job=jobs.to_public(session, made))
        return JSONResponse(pending.model_dump(mode="json"), status_code=202)
    return plans.to_public(made)


@router.get("/{plan_id}", response_model=PlanPublic, summary="Get a plan", responses=NOT_FOUND,
            description="A stored plan with its prediction; another user's plan is a 404, as a missing one (an admin sees all).")
def get_plan(plan_id: PlanId, session: SessionDep, principal: ReadAccess) -> PlanPublic:
    return plans.to_public(ownership.plan_for(session, principal, plan_id))
