"""`/contexts`: code contexts, a user's project archive (.tar.gz or .zip) that models run from."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Path, Response, UploadFile

from pipeboard.app.api.common import AUTH_RESPONSES, NOT_FOUND, ServiceRoute
from pipeboard.app.api.deps import SessionDep
from pipeboard.app.api.security import ReadAccess, WriteAccess
from pipeboard.app.core.config import get_settings
from pipeboard.app.models import CodeContext
from pipeboard.app.schemas import ContextPublic, Message, SHA256_PATTERN, ValidationFailed
from pipeboard.app.services import contexts

router = APIRouter(prefix="/contexts", tags=["contexts"], route_class=ServiceRoute, responses=AUTH_RESPONSES)

Sha256 = Annotated[str, Path(pattern=SHA256_PATTERN, description="The archive's SHA-256 (lower-case hex).")]


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
        "absolute paths, `..` and links are refused (422). Stored by the SHA-256 of its bytes; the same "
        "archive again answers 200 with the stored one. Needs a write token."
    ),
    responses={200: {"model": ContextPublic, "description": "Already stored."},
               413: {"model": Message, "description": "Too large, packed or unpacked."},
               422: {"model": ValidationFailed, "description": "Not an archive, or a member is refused."}},
)
def upload_context(session: SessionDep, _: WriteAccess, response: Response,
                   file: Annotated[UploadFile, File(description="The project, .tar.gz or .zip")]) -> ContextPublic:
    # A plain `def`: FastAPI runs it in its thread pool, so checking an archive (decompressing it
    # member by member, seconds for a large one) never holds the event loop other requests need.
    settings = get_settings()
    content = file.file.read(settings.max_upload_bytes + 1)  # never more than the limit in memory
    row, new = contexts.store(session, content, file.filename or "context",
                              max_bytes=settings.max_upload_bytes, max_unpacked=settings.max_context_bytes)
    if not new:
        response.status_code = 200
    return public(row)


@router.get(
    "/{sha256}",
    response_model=ContextPublic,
    summary="Get a code context",
    description="Whether an archive with this SHA-256 is stored (clients check before uploading).",
    responses=NOT_FOUND,
)
def get_context(sha256: Sha256, session: SessionDep, _: ReadAccess) -> ContextPublic:
    return public(contexts.get(session, sha256))
