"""POST /plans: resolve the profile (stored, or a model's cached one), plan, simulate, store.

No model code runs in the API process: a model without a cached profile is profiled by a Celery
worker, as a profiling job (kind `profile`, its specification's `calibrate_for` the run the what-if
plans for), and the what-if answers 202 with that job; once it has succeeded the same request
plans at once from the profile it stored. Planning and simulating are the planner's own Python,
no user code. One profiling job per model, arguments and run shape at a time: a second what-if
for it gets the job already queued or running."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from pipeboard.app.models import Job, JobStatus, Model, ModelStatus
from pipeboard.app.models import Plan as PlanRow
from pipeboard.app.models import Profile
from pipeboard.app.schemas import PlanCreate, PlanPublic, ProfileJobSpec
from pipeboard.app.services import planning, profiles
from pipeboard.app.services.errors import NotFound, ServiceError
from pipeboard.app.services.tx import begin_write


def profile_spec(body: PlanCreate) -> ProfileJobSpec:
    """The profiling job a what-if by model name needs: profiled as its job would be."""
    from pipeboard.trainer.plan.cluster import total_workers

    micro = max(1, body.batch_size // body.microbatches)
    return ProfileJobSpec(
        name=f"profile {body.model} for a what-if", model={"name": body.model, "args": body.model_args, "batch_size": micro},
        layout={"workers": 1, "microbatches": 1}, length={"steps": 1},
        calibrate_for={"workers": total_workers(planning.levels_of(body.levels, None)), "batch_size": body.batch_size,
                       "microbatches": body.microbatches, "weight_grads": body.weight_grads})


def cached_profile(session: Session, body: PlanCreate) -> Profile | None:
    """The model's cached profile for the what-if's run (the key its profiling job stores under)."""
    spec = profile_spec(body)
    source, kind, default_args, _ = profiles.resolve_model(session, body.model)
    if kind == "zoo":
        from pipeboard.app.services.jobs import validate_model_args

        validate_model_args(body.model, body.model_args, where="model_args")
    run = spec.calibrate_for
    calibration = profiles.calibration_args(run.workers, run.batch_size, run.weight_grads, microbatches=run.microbatches)
    key = profiles.cache_key(body.model, {**default_args, **body.model_args}, spec.model.batch_size, calibration=calibration)
    # as the profiling job looks it up: a profile calibrated for more (batched weight gradients
    # timed too) serves a run that needs less, and the job then stores none under ``key`` itself
    return profiles.cached(session, key, calibrated_too=True)


def check_ready(session: Session, model: str) -> None:
    """A registered model is profiled only once a worker has validated it (`ready`)."""
    row = session.scalar(select(Model).where(Model.name == model))
    if row is None:
        return
    status = ModelStatus(row.status)
    if status is ModelStatus.VALIDATING:
        raise ServiceError(f"model: {model!r} is still being validated by a worker (GET /api/v1/models/{model}); "
                           "plan it once it is ready", status=422, field="model")
    if status is ModelStatus.FAILED:
        raise ServiceError(f"model: {model!r} failed validation: {row.message}", status=422, field="model")


def profiling_job(session: Session, spec: ProfileJobSpec, *, submitted_by: str | None = None,
                  owner_id: int | None = None) -> Job:
    """The queued or running profiling job for ``spec``, else a new one (on a worker)."""
    from pipeboard.app.services import jobs

    wanted = spec.model_dump(mode="json")
    mine = Job.owner_id.is_(None) if owner_id is None else Job.owner_id == owner_id
    waiting = session.scalars(select(Job).where(Job.kind == "profile", mine,
                                                Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)))).all()
    for job in waiting:
        if job.spec == wanted:
            return job
    return jobs.submit(session, spec, kind="profile", submitted_by=submitted_by, owner_id=owner_id)


def create(session: Session, body: PlanCreate, *, submitted_by: str | None = None,
           owner_id: int | None = None) -> PlanRow | Job:
    """The plan (a stored PlanRow) when the profile is there; else the profiling job that makes it."""
    if body.profile_id is not None:
        prof = session.get(Profile, body.profile_id)
        if prof is None:
            raise NotFound("profile", body.profile_id)
    else:
        prof = cached_profile(session, body)
        if prof is None:
            check_ready(session, body.model)
            return profiling_job(session, profile_spec(body), submitted_by=submitted_by, owner_id=owner_id)
    plan_obj = planning.make_plan(prof.data, planning.levels_of(body.levels, None), memory_bytes=body.memory_bytes,
                                  method=body.method, schedule=body.schedule, microbatches=body.microbatches,
                                  weight_grads=body.weight_grads, chunks=body.chunks, recompute=body.recompute,
                                  optimizer=body.optimizer)
    # what was asked, or (under a cap) the stages the choice turned recompute on for, those included
    sched, sim = planning.simulate(plan_obj, body.schedule, body.microbatches, samples_per_microbatch=prof.batch_size,
                                   chunks=body.chunks, weight_grads=body.weight_grads, profile_data=prof.data,
                                   recompute=planning.chosen_recompute(plan_obj, body.recompute),
                                   optimizer=body.optimizer)
    predicted = planning.predicted_summary(plan_obj, sched, sim, body.microbatches, body.timeline_limit)
    request = body.model_dump(mode="json", exclude={"timeline_limit"})
    row = PlanRow(profile_id=prof.id, request=request, data=plan_obj.to_dict(), predicted=predicted, owner_id=owner_id)
    begin_write(session)
    session.add(row)
    session.commit()
    return row


def get(session: Session, plan_id: int) -> PlanRow:
    row = session.get(PlanRow, plan_id)
    if row is None:
        raise NotFound("plan", plan_id)
    return row


def to_public(row: PlanRow) -> PlanPublic:
    return PlanPublic(id=row.id, profile_id=row.profile_id, request=row.request, plan=row.data, predicted=row.predicted or {}, created_at=row.created_at)
