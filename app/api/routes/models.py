"""`/models`: the zoo plus users' task factories (import paths or code contexts), validated by a worker.

A registered model is its registering user's (app/api/ownership.py): others neither list nor get
it (404), nor train it; an admin token sees and deletes any."""

from __future__ import annotations

from fastapi import APIRouter, Response
from sqlalchemy import select, update

from pipeboard.app.api import ownership
from pipeboard.app.api.common import AUTH_RESPONSES, NOT_FOUND, Limit, Offset, ServiceRoute
from pipeboard.app.api.deps import SessionDep
from pipeboard.app.api.security import ReadAccess, WriteAccess
from pipeboard.app.models import Job, JobStatus, Profile
from pipeboard.app.schemas import Message, ModelCreate, ModelPublic, Page, ValidationFailed
from pipeboard.app.services import catalog
from pipeboard.app.services.errors import NotFound, ServiceError
from pipeboard.app.services.tx import begin_write

router = APIRouter(prefix="/models", tags=["models"], route_class=ServiceRoute, responses=AUTH_RESPONSES)

CONFLICT = {409: {"model": Message, "description": "A zoo model, or one that queued or running jobs train."}}


@router.get(
    "",
    response_model=Page[ModelPublic],
    summary="List models",
    description="The zoo's models (id null, always available) followed by the registered models the token's user owns "
                "(every user's for an admin token).",
)
def list_models(session: SessionDep, principal: ReadAccess, offset: Offset = 0, limit: Limit = 100) -> Page[ModelPublic]:
    data, count = catalog.list_models(session, offset, limit, owner_id=ownership.owner_scope(principal))
    return Page(data=data, count=count)


@router.post(
    "",
    response_model=ModelPublic,
    status_code=202,
    summary="Register a task factory",
    description=(
        "Stores the model as `validating` and queues its validation on a worker, which builds the task "
        "(in the code context `context`, if given), checks one batch through it and splits it into layers, "
        "in a subprocess with time and memory limits; then GET shows `ready` or `failed` with the message. "
        "Nothing of the model runs in the API. 409: the name is taken; 422: `context` unknown or not the user's "
        "(the same answer), a file path without one, or a `source` file that is not inside the context. "
        "Needs a write token; the model is its user's."
    ),
    responses={409: {"model": Message, "description": "The name is taken."},
               422: {"model": ValidationFailed, "description": "Invalid request."},
               503: {"model": Message, "description": "The broker cannot queue the validation."}},
)
def register_model(body: ModelCreate, session: SessionDep, principal: WriteAccess) -> ModelPublic:
    if body.context is not None and not ownership.context_visible(session, principal, body.context):
        raise ServiceError(catalog.unknown_context(body.context), status=422, field="context")
    return catalog.to_public(catalog.register(session, body, owner_id=principal.user_id))


@router.get(
    "/{model_ref}",
    response_model=ModelPublic,
    summary="Get a model",
    description="By registered id, or by name (zoo or registered). Another user's model is not found (404).",
    responses=NOT_FOUND,
)
def get_model(model_ref: str, session: SessionDep, principal: ReadAccess) -> ModelPublic:
    row = catalog.find(session, model_ref)
    if row is not None and not ownership.model_visible(principal, row):
        raise NotFound("model", model_ref)
    return catalog.get(session, model_ref)


@router.delete(
    "/{model_ref}",
    status_code=204,
    summary="Delete a registered model",
    description=(
        "Its owner's write token or an admin token; another user's model is not found (404). Zoo models cannot be "
        "deleted, nor a model that queued or running jobs train (409 naming them). Finished jobs keep their "
        "specification and data; profiles measured of it stay its owner's."
    ),
    responses={**NOT_FOUND, **CONFLICT},
    response_class=Response,
)
def delete_model(model_ref: str, session: SessionDep, principal: WriteAccess) -> Response:
    row = catalog.find(session, model_ref)
    if row is None or not ownership.model_visible(principal, row):
        if row is None and any(m.name == model_ref for m in catalog.zoo_public()):
            raise ServiceError(f"model: {model_ref!r} is a zoo model, part of pipeboard; it cannot be deleted",
                               status=409, field="model")
        raise NotFound("model", model_ref)
    active = [job.id for job in session.scalars(select(Job).where(Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING))))
              if job.model_id == row.id or trained_model(job.spec) == row.name]
    if active:
        raise ServiceError(f"model: {row.name!r} is trained by job(s) {', '.join(map(str, active))}; cancel them first",
                           status=409, field="model")
    begin_write(session)
    # Profiles measured of it had no owner but the model's: they keep that owner (app/api/ownership.py).
    session.execute(update(Profile).where(Profile.model_id == row.id, Profile.owner_id.is_(None))
                    .values(owner_id=row.owner_id))
    session.delete(row)
    session.commit()
    return Response(status_code=204)


def trained_model(spec: dict) -> str | None:
    """The model a job's stored specification names (version 2: `model.name`; version 1: `model`)."""
    model = spec.get("model") if isinstance(spec, dict) else None
    return model.get("name") if isinstance(model, dict) else model


