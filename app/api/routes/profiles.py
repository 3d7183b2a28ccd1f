"""`/profiles`: profile a model (a job), upload graph.txt or profile JSON, read one back."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Query, UploadFile

from pipeboard.app.api.deps import SessionDep
from pipeboard.app.schemas import Message, ValidationFailed
from pipeboard.app.api.common import AUTH_RESPONSES, NOT_FOUND, Limit, Offset, ProfileId, ServiceRoute
from pipeboard.app.core.config import get_settings
from pipeboard.app.api import ownership
from pipeboard.app.api.nesting import nesting_problem
from pipeboard.app.api.security import ReadAccess, WriteAccess
from pipeboard.app.schemas import JobPublic, Page, ProfileCreate, ProfileJobSpec, ProfilePublic
from pipeboard.app.services import jobs, profiles
from pipeboard.app.services.errors import NotFound, ServiceError

router = APIRouter(prefix="/profiles", tags=["profiles"], route_class=ServiceRoute, responses=AUTH_RESPONSES)


@router.post(
    "",
    response_model=JobPublic,
    status_code=202,
    summary="Profile a model (as a task)",
    description=(
        "Queues a profiling job (kind `profile`) on the worker and answers at once with it. When the job has "
        "succeeded its `profile_id` names the stored profile. A profile of the same model, arguments and batch "
        "size is reused rather than measured again."
    ),
    responses={422: {"model": ValidationFailed, "description": "Unknown model or invalid arguments."}},
)
def create_profile(body: ProfileCreate, session: SessionDep, principal: WriteAccess) -> JobPublic:
    ownership.check_job_model(session, principal, body.model, field="model")  # another user's: unknown
    _, kind, _, _ = profiles.resolve_model(session, body.model)  # 422 naming `model` before anything is queued
    if kind == "zoo":
        jobs.validate_model_args(body.model, body.model_args, where="model_args")
    spec = ProfileJobSpec(name=f"profile {body.model}", repeats=body.repeats, length={"steps": 1},
                          model={"name": body.model, "args": body.model_args, "batch_size": body.batch_size},
                          layout={"workers": 1, "microbatches": 1}, machine={"device": body.device})
    job = jobs.submit(session, spec, kind="profile", submitted_by=principal.name, owner_id=principal.user_id)
    return jobs.to_public(session, job)


@router.post(
    "/upload",
    response_model=ProfilePublic,
    status_code=201,
    summary="Upload a profile",
    description=(
        "A PipeDream `graph.txt` or a pipeboard profile JSON (chosen by content), as multipart field `file`. "
        "Larger than the server's MAX_UPLOAD_BYTES: 413. Unreadable: 422 naming the line and field."
    ),
    responses={413: {"model": Message, "description": "Upload too large."}, 422: {"model": ValidationFailed, "description": "Not a readable profile."}},
)
async def upload_profile(
    session: SessionDep,
    principal: WriteAccess,
    file: Annotated[UploadFile, File(description="graph.txt or profile JSON")],
    name: Annotated[str | None, Query(max_length=200, description="Name to store it under (default: the file name).")] = None,
) -> ProfilePublic:
    limit = get_settings().max_upload_bytes
    content = await file.read(limit + 1)  # never more than the limit in memory
    problem = nesting_problem(content, "file") if content.lstrip()[:1] in (b"{", b"[") else None
    if problem:  # before json.loads recurses into it (app/api/nesting.py)
        raise ServiceError(problem, status=422, field="file")
    data = profiles.parse_upload(content, file.filename or "upload", limit)
    row = profiles.store(session, data, name=(name or file.filename or "upload")[:200], origin="upload")
    row.owner_id = principal.user_id  # an uploaded profile is its uploader's (app/api/ownership.py)
    session.commit()
    return profiles.to_public(row)


@router.get(
    "",
    response_model=Page[ProfilePublic],
    summary="List profiles",
    description="Newest first, without per-layer rows (GET one profile for those).",
)
def list_profiles(session: SessionDep, principal: ReadAccess, offset: Offset = 0, limit: Limit = 50) -> Page[ProfilePublic]:
    from sqlalchemy import func, select

    from pipeboard.app.models import Profile

    visible = ownership.profile_filter(principal)
    count = session.scalar(select(func.count()).select_from(Profile).where(visible)) or 0
    rows = session.scalars(select(Profile).where(visible).order_by(Profile.id.desc()).offset(offset).limit(limit)).all()
    return Page(data=[profiles.to_public(r).model_copy(update={"layers": []}) for r in rows], count=count)


@router.get(
    "/{profile_id}",
    response_model=ProfilePublic,
    summary="Get a profile",
    description="Per-layer rows (forward/backward ms, activation and parameter bytes); `include_data` adds the full JSON.",
    responses=NOT_FOUND,
)
def get_profile(profile_id: ProfileId, session: SessionDep, principal: ReadAccess, include_data: bool = False) -> ProfilePublic:
    row = profiles.get(session, profile_id)
    if not ownership.profile_visible(session, principal, row):
        raise NotFound("profile", profile_id)
    return profiles.to_public(row, include_data=include_data)


