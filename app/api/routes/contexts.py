"""`/contexts`: code contexts, a user's project archive (.tar.gz or .zip) that models run from.

Stored once by content, owned per user (app/api/ownership.py): each user who uploaded the same
bytes, or was shared them, may see and use it; to anyone else it is not found (404)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Path, Response, UploadFile
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import delete, func, select

from pipeboard.app.api import ownership
from pipeboard.app.api.common import AUTH_RESPONSES, NOT_FOUND, ServiceRoute
from pipeboard.app.api.deps import SessionDep
from pipeboard.app.api.security import ReadAccess, WriteAccess
from pipeboard.app.core.config import get_settings
from pipeboard.app.models import CodeContext, ContextAccess, Model, User
from pipeboard.app.schemas import ContextPublic, Message, SHA256_PATTERN, ValidationFailed
from pipeboard.app.services import contexts
from pipeboard.app.services.errors import ServiceError
from pipeboard.app.services.tx import begin_read_write

router = APIRouter(prefix="/contexts", tags=["contexts"], route_class=ServiceRoute, responses=AUTH_RESPONSES)

Sha256 = Annotated[str, Path(pattern=SHA256_PATTERN, description="The archive's SHA-256 (lower-case hex).")]


class ContextShare(BaseModel):
    """Whom to share a context with."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"user": "bob"}]})
    user: str = Field(min_length=1, max_length=120, description="The user's name (as `pipeboard token create --user`).")


class ContextShared(BaseModel):
    sha256: str
    user: str
    shared: bool = Field(description="False when the user could use it already.")


def public(row: CodeContext) -> ContextPublic:
    return ContextPublic(sha256=row.sha256, filename=row.filename, kind=row.kind, size=row.size, files=row.files,
                         unpacked_bytes=row.unpacked_bytes, created_at=row.created_at)


@router.post(
    "",
    response_model=ContextPublic,
    status_code=201,
    summary="Upload a code context",
    description=(
        "A project as a .tar.gz or .zip, multipart field `file`. Checked, never run here: at most "
        "MAX_UPLOAD_BYTES packed and MAX_CONTEXT_BYTES unpacked (413), regular files and folders only: "
        "absolute paths, `..` and links are refused, and so is a truncated or damaged archive (422). Stored by the "
        "SHA-256 of its bytes and the token's user's from then on; the same archive again from the same user "
        "answers 200. Needs a write token."
    ),
    responses={200: {"model": ContextPublic, "description": "This user had it already."},
               413: {"model": Message, "description": "Too large, packed or unpacked."},
               422: {"model": ValidationFailed, "description": "Not an archive, a damaged one, or a member is refused."}},
)
def upload_context(session: SessionDep, principal: WriteAccess, response: Response,
                   file: Annotated[UploadFile, File(description="The project, .tar.gz or .zip")]) -> ContextPublic:
    # A plain `def`: FastAPI runs it in its thread pool, so checking an archive (decompressing it
    # member by member, seconds for a large one) never holds the event loop other requests need.
    settings = get_settings()
    content = file.file.read(settings.max_upload_bytes + 1)  # never more than the limit in memory
    row, new = contexts.store(session, content, file.filename or "context",
                              max_bytes=settings.max_upload_bytes, max_unpacked=settings.max_context_bytes)
    # Whether someone else stored these bytes first is none of this user's business: 201 unless
    # this user had them already.
    if principal.user_id is not None:
        begin_read_write(session)  # grant reads, then writes: no commit may come between (SQLite)
        new = ownership.grant_context(session, row.sha256, principal.user_id)
        session.commit()
    if not new:
        response.status_code = 200
    return public(row)


@router.get(
    "/{sha256}",
    response_model=ContextPublic,
    summary="Get a code context",
    description="Whether this user has an archive with this SHA-256 (clients check before uploading); 404 otherwise.",
    responses=NOT_FOUND,
)
def get_context(sha256: Sha256, session: SessionDep, principal: ReadAccess) -> ContextPublic:
    return public(ownership.context_for(session, principal, sha256))


@router.post(
    "/{sha256}/share",
    response_model=ContextShared,
    summary="Share a code context with another user",
    description=(
        "The user may then see it and register models in it. Needs a write token of a user who has the context "
        "(or an admin token); 422 naming `user` for a user that does not exist."
    ),
    responses=NOT_FOUND,
)
def share_context(sha256: Sha256, body: ContextShare, session: SessionDep, principal: WriteAccess) -> ContextShared:
    ownership.context_for(session, principal, sha256)
    user = session.scalar(select(User).where(User.name == body.user))
    if user is None:
        raise ServiceError(f"user: no user named {body.user!r}", status=422, field="user")
    begin_read_write(session)
    shared = ownership.grant_context(session, sha256, user.id, granted_by=principal.user_id)
    session.commit()
    return ContextShared(sha256=sha256, user=user.name, shared=shared)


@router.delete(
    "/{sha256}",
    status_code=204,
    summary="Delete a code context",
    description=(
        "With an admin token: the stored archive itself, for everyone. With a user's write token: that user's "
        "access; the archive goes once no user has it. 409 naming the models that run from it (delete them "
        "first); 404 for a context the user does not have."
    ),
    responses={**NOT_FOUND, 409: {"model": Message, "description": "Models run from it."}},
    response_class=Response,
)
def delete_context(sha256: Sha256, session: SessionDep, principal: WriteAccess) -> Response:
    ownership.context_for(session, principal, sha256)
    users_models = select(Model.name).where(Model.context_sha256 == sha256)
    if not ownership.sees_all(principal):
        users_models = users_models.where(Model.owner_id == principal.user_id)
    names = session.scalars(users_models.order_by(Model.name)).all()
    if names:
        raise ServiceError(f"context: models {', '.join(names)} run from it; delete them first", status=409, field="context")
    begin_read_write(session)  # counts what is left, then deletes
    if not ownership.sees_all(principal):
        session.execute(delete(ContextAccess).where(ContextAccess.sha256 == sha256,
                                                    ContextAccess.user_id == principal.user_id))
    others = session.scalar(select(func.count()).select_from(ContextAccess).where(ContextAccess.sha256 == sha256)) or 0
    still_used = session.scalar(select(func.count()).select_from(Model).where(Model.context_sha256 == sha256)) or 0
    if ownership.sees_all(principal) or (others == 0 and still_used == 0):
        session.execute(delete(ContextAccess).where(ContextAccess.sha256 == sha256))
        session.execute(delete(CodeContext).where(CodeContext.sha256 == sha256))
    session.commit()
    return Response(status_code=204)
