"""POST /plans: resolve the profile (stored, or a model's cached one, measured on first use),
plan, simulate, store."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from sqlalchemy.orm import Session

from pipeboard.app.models import Plan as PlanRow
from pipeboard.app.models import Profile
from pipeboard.app.schemas import PlanCreate, PlanPublic
from pipeboard.app.services import planning, profiles
from pipeboard.app.services.errors import NotFound, ServiceError
from pipeboard.app.services.tx import begin_write

PROFILE_TIMEOUT_S = 300
_profiling = threading.Lock()  # one inline profiling at a time: a second what-if waits, then hits the cache


def profile_for_model(session: Session, model: str, model_args: dict, batch_size: int,
                      calibration: list[str] | None = None) -> Profile:
    """The model's cached profile at ``batch_size``, else measured now; ``calibration``:
    profile_run's calibration flags (profiles.calibration_args), part of the cache key."""
    source, kind, default_args, model_id = profiles.resolve_model(session, model)
    if kind == "zoo":
        from pipeboard.app.services.jobs import validate_model_args

        validate_model_args(model, model_args)
    args = {**default_args, **model_args}
    key = profiles.cache_key(model, args, batch_size, calibration=calibration)
    row = profiles.cached(session, key)
    if row is not None:
        return row
    with _profiling:
        session.expire_all()
        row = profiles.cached(session, key)
        if row is not None:
            return row
        with tempfile.TemporaryDirectory(prefix="pipeboard-profile-") as tmp:
            out = Path(tmp) / "profile.json"
            cmd = [sys.executable, "-m", "pipeboard.app.services.profile_run", "--source", source,
                   "--model-args", json.dumps(args), "--batch-size", str(batch_size), "-o", str(out),
                   *(calibration or []), *profiles.machine_cache_args(calibration or [])]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=PROFILE_TIMEOUT_S, start_new_session=True)
            except subprocess.TimeoutExpired:
                raise ServiceError(f"model: profiling {model!r} took over {PROFILE_TIMEOUT_S} s; POST /profiles to profile it as a task", status=422, field="model") from None
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["profiling failed"])[-1]
                raise ServiceError(f"model_args: {last}", status=422, field="model_args")
            row = profiles.store(session, json.loads(out.read_text()), name=key, origin="profiled", model_id=model_id)
        session.commit()
        return row


def create(session: Session, body: PlanCreate) -> PlanRow:
    levels = planning.levels_of(body.levels, None)
    if body.profile_id is not None:
        prof = session.get(Profile, body.profile_id)
        if prof is None:
            raise NotFound("profile", body.profile_id)
    else:
        # Same cache key as a job's profile on as many local workers: one microbatch's worth of
        # samples, calibrated for the runtime (see profiles.calibration_args).
        from pipeboard.trainer.plan.cluster import total_workers

        prof = profile_for_model(session, body.model, body.model_args, max(1, body.batch_size // body.microbatches),
                                 profiles.calibration_args(total_workers(levels), body.batch_size, body.weight_grads,
                                                           microbatches=body.microbatches))
    plan_obj = planning.make_plan(prof.data, levels, memory_bytes=body.memory_bytes, method=body.method,
                                  schedule=body.schedule, microbatches=body.microbatches,
                                  weight_grads=body.weight_grads, chunks=body.chunks)
    sched, sim = planning.simulate(plan_obj, body.schedule, body.microbatches, samples_per_microbatch=prof.batch_size,
                                   chunks=body.chunks, weight_grads=body.weight_grads, profile_data=prof.data)
    predicted = planning.predicted_summary(plan_obj, sched, sim, body.microbatches, body.timeline_limit)
    request = body.model_dump(mode="json", exclude={"timeline_limit"})
    row = PlanRow(profile_id=prof.id, request=request, data=plan_obj.to_dict(), predicted=predicted)
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
