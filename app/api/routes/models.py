"""`/models`: the zoo plus models registered by import path."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import SessionDep
from app.schemas import Message, ValidationFailed
from app.api.common import AUTH_RESPONSES, NOT_FOUND, Limit, Offset, ServiceRoute
from app.api.security import ReadAccess, WriteAccess
from app.schemas import ModelCreate, ModelPublic, Page
from app.services import catalog

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
    status_code=201,
    summary="Register a model by import path",
    description=(
        "Imports `package.module:factory`, calls it with `config`, and traces the returned module with "
        "torch.fx on its example input. A model that cannot be imported, built or traced is refused with "
        "422 naming `source` and the failing op. Needs a write token (this imports server-side code)."
    ),
    responses={409: {"model": Message, "description": "The name is taken."}, 422: {"model": ValidationFailed, "description": "Invalid or untraceable model."}},
)
def register_model(body: ModelCreate, session: SessionDep, _: WriteAccess) -> ModelPublic:
    return catalog.register(session, body)


@router.get(
    "/{model_ref}",
    response_model=ModelPublic,
    summary="Get a model",
    description="By registered id, or by name (zoo or registered).",
    responses=NOT_FOUND,
)
def get_model(model_ref: str, session: SessionDep, _: ReadAccess) -> ModelPublic:
    return catalog.get(session, model_ref)
