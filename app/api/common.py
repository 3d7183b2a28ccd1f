"""What every resource router shares: ServiceError -> HTTP 4xx, and list paging parameters."""

from __future__ import annotations

from typing import Annotated, Any, Callable, Coroutine

from fastapi import HTTPException, Path, Query, Request, Response
from fastapi.routing import APIRoute

from app.schemas import Message, ValidationFailed
from app.services.errors import ServiceError


class ServiceRoute(APIRoute):
    """A route whose handler may raise ServiceError: it becomes `{"detail": message}` with the
    error's status, so route functions stay free of try/except boilerplate."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def translating_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except ServiceError as exc:
                raise HTTPException(status_code=exc.status, detail=exc.message) from None

        return translating_handler


Offset = Annotated[int, Query(ge=0, le=10_000_000, description="Rows to skip.")]
Limit = Annotated[int, Query(ge=1, le=1000, description="Rows to return (at most 1000).")]

# Declared on every router so the OpenAPI describes the bodies clients really get.
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": Message, "description": "Malformed request (e.g. a body that is not JSON)."},
    401: {"model": Message, "description": "Missing or invalid API token."},
    403: {"model": Message, "description": "The token's scope does not allow this."},
    422: {"model": ValidationFailed, "description": "Invalid input; `detail` names the field."},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": Message, "description": "No such resource."}}

# Ids are bounded so that absurd values get a 422 instead of overflowing the database's integer.
MAX_ID = 2**31 - 1
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="The job's id.")]
ProfileId = Annotated[int, Path(ge=1, le=MAX_ID, description="The profile's id.")]
PlanId = Annotated[int, Path(ge=1, le=MAX_ID, description="The plan's id.")]
TokenId = Annotated[int, Path(ge=1, le=MAX_ID, description="The token's id.")]
