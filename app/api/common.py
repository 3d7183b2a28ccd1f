"""What every resource router shares: ServiceError -> HTTP 4xx, request bodies in the declared
content type and size, the 405's `Allow` header, and list paging parameters."""

from __future__ import annotations

from typing import Annotated, Any, Callable, Coroutine

from fastapi import HTTPException, Path, Query, Request, Response, params
from fastapi.routing import APIRoute
from starlette.routing import Match, Mount, get_route_path
from starlette.types import Scope

from pipeboard.app.api.bodies import body_limit, check_content_type, has_body
from pipeboard.app.api.nesting import nesting_problem
from pipeboard.app.core.config import get_settings
from pipeboard.app.schemas import Message, ValidationFailed
from pipeboard.app.services.errors import ServiceError

PROBED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


class ServiceRoute(APIRoute):
    """A route whose handler may raise ServiceError: it becomes `{"detail": message}` with the
    error's status, so route functions stay free of try/except boilerplate. A JSON body nested
    past MAX_JSON_DEPTH is a 422 naming the body before FastAPI parses it.

    Its body must come in the content type it declares and stay within its size limit
    (app/api/bodies.py): MAX_UPLOAD_BYTES on upload routes, MAX_BODY_BYTES on the others, read when
    the route is made (at start-up), as FastAPI's per-route `max_body_size`.
    """

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        if self.max_body_size is None:
            # Read where the router is included: FastAPI wraps each inclusion's handler with it.
            self.max_body_size = body_limit(get_settings(), multipart=self.body_kind == "form")[0]

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        # OpenAPI matches a concrete path before a templated one: /profiles/upload is not profile
        # "upload" of /profiles/{profile_id}, so GET on it is a 405, as its `Allow` says.
        if match is not Match.NONE and self.param_convertors and get_route_path(scope) in concrete_paths(scope.get("app")):
            return Match.NONE, {}
        return match, child_scope

    @property
    def body_kind(self) -> str | None:
        if self.body_field is None:
            return None
        return "form" if isinstance(self.body_field.field_info, params.Form) else "json"

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        kind = self.body_kind

        async def translating_handler(request: Request) -> Response:
            if kind is not None and has_body(request):
                check_content_type(request, kind)
                if kind == "json":  # measured before any parser recurses into it (app/api/nesting.py)
                    problem = nesting_problem(await request.body(), "body")
                    if problem:
                        raise HTTPException(status_code=422, detail=problem)
            try:
                return await handler(request)
            except ServiceError as exc:
                raise HTTPException(status_code=exc.status, detail=exc.message) from None

        return translating_handler


def concrete_paths(app: Any) -> frozenset[str]:
    """The app's documented paths without parameters (read from its OpenAPI document, once)."""
    state = getattr(app, "state", None)
    if state is None:
        return frozenset()
    if getattr(state, "concrete_paths", None) is None:
        state.concrete_paths = frozenset(p for p in app.openapi()["paths"] if "{" not in p)
    return state.concrete_paths


def allowed_methods(request: Request) -> list[str]:
    """The methods some API route answers at this path (for a 405's `Allow`); [] off the API.

    Starlette's router answers 405 with the methods of the first route at the path only (GET, but
    not the POST beside it); this asks every route. The dashboard's static mount matches any
    method and is left out: its own 405 names GET and HEAD.
    """
    allowed = []
    for method in PROBED_METHODS:
        probe = {**request.scope, "method": method}
        if any(route.matches(probe)[0] == Match.FULL for route in request.app.router.routes if not isinstance(route, Mount)):
            allowed.append(method)
    if "GET" in allowed and "HEAD" not in allowed:
        allowed.insert(allowed.index("GET") + 1, "HEAD")  # app/api/head.py answers HEAD as GET
    return allowed


Offset = Annotated[int, Query(ge=0, le=10_000_000, description="Rows to skip.")]
Limit = Annotated[int, Query(ge=1, le=1000, description="Rows to return (at most 1000).")]

# Declared on every router so the OpenAPI describes the bodies clients really get.
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": Message, "description": "Malformed request (e.g. a body that is not JSON)."},
    401: {"model": Message, "description": "Missing, invalid, revoked or expired API token."},
    403: {"model": Message, "description": "The token's scope does not allow this (the message names the scope needed)."},
    413: {"model": Message, "description": "Request body over MAX_BODY_BYTES (uploads: MAX_UPLOAD_BYTES)."},
    415: {"model": Message, "description": "A body in another content type than the route takes (JSON, or multipart for uploads)."},
    422: {"model": ValidationFailed, "description": "Invalid input; `detail` names the field."},
    429: {"model": Message, "description": "Too many failed authentications from this address; see `Retry-After`."},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": Message, "description": "No such resource."}}

# Ids are bounded so that absurd values get a 422 instead of overflowing the database's integer.
MAX_ID = 2**31 - 1
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="The job's id.")]
ProfileId = Annotated[int, Path(ge=1, le=MAX_ID, description="The profile's id.")]
PlanId = Annotated[int, Path(ge=1, le=MAX_ID, description="The plan's id.")]
TokenId = Annotated[int, Path(ge=1, le=MAX_ID, description="The token's id.")]
