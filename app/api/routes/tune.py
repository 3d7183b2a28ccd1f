"""`/tune`: choose the split, schedule, microbatches and recompute of a run (pipeboard.trainer.tune)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from pipeboard.app.api import ownership
from pipeboard.app.api.common import AUTH_RESPONSES, ServiceRoute
from pipeboard.app.api.deps import SessionDep
from pipeboard.app.api.security import WriteAccess
from pipeboard.app.models import Job
from pipeboard.app.schemas import Message, ValidationFailed
from pipeboard.app.schemas.tune import TuneCreate, TunePending, TunePublic
from pipeboard.app.services import jobs, tuning

router = APIRouter(prefix="/tune", tags=["tune"], route_class=ServiceRoute, responses=AUTH_RESPONSES)


@router.post(
    "",
    response_model=TunePublic,
    summary="Tune a run (choose split, schedule, microbatches, recompute)",
    description=(
        "Searches the planner's splits and replication, every registered schedule that can run them (data "
        "parallelism included), the microbatch counts `microbatches` that divide `batch_size` and have a profile "
        "at their microbatch size, and recompute off or on per stage; predicts each candidate's step time and "
        "per-worker peak memory with the profile cost model, and ranks those under `memory_per_worker_bytes` by "
        "predicted time per sample, then the rest with why they do not fit (200). Give `profile_ids` (stored "
        "profiles, one per microbatch size) or `model` (its cached profiles; one not cached yet: 202 with "
        "the profiling job for it, ask again once it has succeeded, until every size is there). A cap nothing fits is a 422 naming the smallest memory "
        "any candidate needs. Nothing is stored; `job_layout` is the choice as a job's layout. Token rules as "
        "POST /plans: a write token, and only profiles and models the caller can see."
    ),
    responses={
        202: {"model": TunePending, "description": "The model is being profiled on a worker: follow `job`, then ask again."},
        404: {"model": Message, "description": "No such profile."},
        422: {"model": ValidationFailed, "description": "Invalid input, or a cap nothing fits (the message names the field)."},
    },
)
def create_tune(body: TuneCreate, session: SessionDep, principal: WriteAccess) -> TunePublic | JSONResponse:
    if body.model is not None:
        ownership.check_job_model(session, principal, body.model, field="model")  # another user's model reads as unknown
    made = tuning.tune(session, body, lambda row: ownership.profile_visible(session, principal, row),
                       submitted_by=principal.name, owner_id=principal.user_id)
    if isinstance(made, Job):
        pending = TunePending(detail=f"profiling {body.model} on a worker (job {made.id}); ask again once it has "
                                     "succeeded", job=jobs.to_public(session, made))
        return JSONResponse(pending.model_dump(mode="json"), status_code=202)
    return TunePublic(**made)
