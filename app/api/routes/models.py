"""`/models`: the zoo plus users' task factories (import paths or code contexts), validated by a worker."""

from __future__ import annotations

from fastapi import APIRouter

from pipeboard.app.api.deps import SessionDep
from pipeboard.app.schemas import Message, ValidationFailed
from pipeboard.app.api.common import AUTH_RESPONSES, NOT_FOUND, Limit, Offset, ServiceRoute
from pipeboard.app.api.security import ReadAccess, WriteAccess
from pipeboard.app.schemas import ModelCreate, ModelPublic, Page
from pipeboard.app.services import catalog

router = APIRouter(prefix="/models", tags=["models"], route_class=ServiceRoute, responses=AUTH_RESPONSES)


@router.get(
    "",
    response_model=Page[ModelPublic],
    summary="List models",
    description="The zoo's models (id null, always available) followed by models registered by import path.",
)
def list_models(session: SessionDep, _: ReadAccess, offset: Offset = 0, limit: Limit = 100) -> Page[ModelPublic]:
    data, count = catalog.list_models(session, offset, limit)
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
        "Nothing of the model runs in the API. 409: the name is taken; 422: `context` unknown, or a file path "
        "without one. Needs a write token."
    ),
    responses={409: {"model": Message, "description": "The name is taken."},
               422: {"model": ValidationFailed, "description": "Invalid request."},
               503: {"model": Message, "description": "The broker cannot queue the validation."}},
)
def register_model(body: ModelCreate, session: SessionDep, _: WriteAccess) -> ModelPublic:
    return catalog.to_public(catalog.register(session, body))


@router.get(
    "/{model_ref}",
    response_model=ModelPublic,
    summary="Get a model",
    description="By registered id, or by name (zoo or registered).",
    responses=NOT_FOUND,
)
def get_model(model_ref: str, session: SessionDep, _: ReadAccess) -> ModelPublic:
    return catalog.get(session, model_ref)
