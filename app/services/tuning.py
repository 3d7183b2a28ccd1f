"""POST /tune: the stored or cached profiles of a model, searched by the tuner (pipeboard.trainer.tune).

Pure computation on the profiles' data, inline, as POST /plans is; a model without a profile
cached at one of the microbatch sizes asked for is profiled by a worker (the what-if's own
profiling job, kind `profile`) and the answer is that job: asked again, the next missing size,
until all are there."""

from __future__ import annotations

from typing import Any, Callable

from sqlalchemy.orm import Session

from pipeboard.app.models import Job, Profile
from pipeboard.app.schemas import PlanCreate
from pipeboard.app.schemas.tune import TuneCreate
from pipeboard.app.services import plans
from pipeboard.app.services.errors import NotFound, ServiceError

# the tuner's names for what was wrong, as the request's fields
FIELDS = {"memory_bytes": "memory_per_worker_bytes", "schedules": "schedules", "workers": "workers",
          "batch_size": "batch_size", "microbatches": "microbatches", "profile": "profile_ids"}


def _what_if(body: TuneCreate, microbatches: int) -> PlanCreate:
    """The what-if whose cached profile is the one for ``microbatches`` (the key its job stores under)."""
    return PlanCreate(model=body.model, model_args=body.model_args, batch_size=body.batch_size,
                      levels=[{"workers": body.workers, "bandwidth": body.bandwidth}], microbatches=microbatches)


def profile_rows(session: Session, body: TuneCreate, visible: Callable[[Profile], bool]
                 ) -> tuple[list[Profile], list[dict[str, str]]] | PlanCreate:
    """The profiles to search (and the counts left out for want of one: none, since a missing one
    is profiled first); or, with `model`, the what-if whose profiling job makes the first missing."""
    counts = [m for m in body.microbatches if body.batch_size % m == 0]
    if body.profile_ids is not None:
        rows = []
        for pid in body.profile_ids:
            row = session.get(Profile, pid)
            if row is None or not visible(row):  # another user's profile: as a missing one
                raise NotFound("profile", pid)
            rows.append(row)
        return rows, []
    if not counts:
        raise ServiceError(f"microbatches: none of {body.microbatches} divides batch_size {body.batch_size}",
                           status=422, field="microbatches")
    rows = []
    for m in counts:
        row = plans.cached_profile(session, _what_if(body, m))
        if row is None:  # profiled first (one job per size, in turn): the search covers every count asked for
            return _what_if(body, m)
        rows.append(row)
    return rows, []


def tune(session: Session, body: TuneCreate, visible: Callable[[Profile], bool], *, submitted_by: str | None = None,
         owner_id: int | None = None) -> dict[str, Any] | Job:
    """The tuner's answer (TunePublic's fields), or the profiling job it waits for."""
    from pipeboard.trainer.profile.schema import Profile as ProfileData
    from pipeboard.trainer.profile.schema import ProfileError
    from pipeboard.trainer.tune import TuneError, search
    from pipeboard.trainer.tune.tuned import job_layout

    found = profile_rows(session, body, visible)
    if isinstance(found, PlanCreate):
        plans.check_ready(session, body.model)
        return plans.profiling_job(session, plans.profile_spec(found), submitted_by=submitted_by, owner_id=owner_id)
    rows, missing = found
    try:
        data = [ProfileData.from_dict(row.data) for row in rows]
    except ProfileError as exc:
        raise ServiceError(f"profile_ids: a stored profile is invalid: {exc}", status=422, field="profile_ids") from None
    sizes = [p.batch_size for p in data]
    if len(set(sizes)) != len(sizes) or len({p.model for p in data}) != 1:
        raise ServiceError(f"profile_ids: one model's profiles, one per microbatch size; got batch sizes {sizes} "
                           f"of {sorted({p.model for p in data})}", status=422, field="profile_ids")
    try:
        result = search(data, workers=body.workers, batch_size=body.batch_size,
                        memory_bytes=body.memory_per_worker_bytes, microbatches=body.microbatches,
                        schedules=body.schedules, bandwidth=body.bandwidth)
    except TuneError as exc:
        field = FIELDS.get(exc.field, exc.field)
        raise ServiceError(f"{field}: {str(exc).split(': ', 1)[-1]}", status=422, field=field) from None
    first = data[0]
    run = {"model": body.model or first.model,
           "model_args": body.model_args if body.model else (first.meta.get("model_args") or {}),
           "data": first.meta.get("data"), "precision": first.meta.get("precision") or "fp32",
           "workers": body.workers, "batch_size": body.batch_size}
    out = result.to_dict()
    out["skipped"] = missing + out["skipped"]
    return {**out, "run": run, "job_layout": job_layout(result.choice, body.workers),
            "profile_ids": [row.id for row in rows]}
