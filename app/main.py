"""The FastAPI application: `create_app()`, and `app` for `uvicorn pipeboard.app.main:app`."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware

from pipeboard.app.api.bodies import DeclaredLengthLimit, body_limit, media_type, too_large
from pipeboard.app.api.common import allowed_methods
from pipeboard.app.api.head import HeadAsGet
from pipeboard.app.api.router import api_router
from pipeboard.app.api.security import FailureLimiter
from pipeboard.app.core.config import VERSION, Settings, get_settings
from pipeboard.app.frontend import mount_frontend

logger = logging.getLogger("pipeboard.api")

DESCRIPTION = (
    "Profile a DNN, plan its PipeDream-style split across workers, simulate and run the "
    "pipeline, and watch predicted and measured timelines live."
)


def field_name(location: tuple | list) -> str:
    """`("body", "spec", "workers")` -> `spec.workers`: the field as a client spelled it."""
    parts = [str(p) for p in location if p not in ("body", "query", "path", "header", "cookie")]
    return ".".join(parts) or ".".join(str(p) for p in location)


async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    # The contract: 4xx with a `detail` message naming the field; `errors` keeps the details.
    errors = exc.errors()
    detail = "; ".join(f"{field_name(e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors)
    return JSONResponse(
        status_code=422,
        content={"detail": detail or "invalid request", "errors": jsonable_errors(errors)},
    )


def jsonable_errors(errors: list) -> list[dict]:
    return [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))} for e in errors]


async def method_not_allowed(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    # Every 405 names every method of the resource (RFC 9110), not the first route's only.
    headers = dict(exc.headers or {})
    methods = allowed_methods(request)
    if methods:
        headers["Allow"] = ", ".join(methods)
    return JSONResponse(status_code=405, content={"detail": f"method {request.method} is not allowed here (allowed: "
                                                            f"{headers.get('Allow', 'none')})"}, headers=headers)


async def body_too_large(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    # A streamed body past the route's limit: Starlette's limit says only "Content Too Large".
    # Routes' own 413s (an upload's file over MAX_UPLOAD_BYTES) keep their message.
    detail = exc.detail
    if detail == "Content Too Large":
        _, setting = body_limit(request.app.state.settings, media_type(request.headers).startswith("multipart/"))
        detail = too_large("the streamed body", request.scope.get(MAX_BODY_SIZE_SCOPE_KEY), setting)
    return JSONResponse(status_code=413, content={"detail": detail}, headers=exc.headers)


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # Log the traceback for operators; the client only learns that it was our fault.
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return JSONResponse(status_code=500, content={"detail": f"internal error ({type(exc).__name__})"})


class InsecureConfiguration(RuntimeError):
    """Settings the API refuses to start with (AUTH=off on an address others can reach)."""


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    refusal = settings.auth_off_refusal()
    if refusal:
        raise InsecureConfiguration(refusal)
    app = FastAPI(title="pipeboard", description=DESCRIPTION, version=VERSION)
    app.state.settings = settings  # what app/api/security.py checks against
    app.state.auth_failures = FailureLimiter(settings.auth_failure_limit)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(405, method_not_allowed)
    app.add_exception_handler(413, body_too_large)
    app.add_exception_handler(Exception, unexpected_error)
    # The last added runs first: the Host allow-list (against DNS rebinding), CORS when configured,
    # then declared body sizes (app/api/bodies.py; routes count streamed bytes).
    app.add_middleware(DeclaredLengthLimit, settings=settings)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "Last-Event-ID"], max_age=600)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=settings.trusted_hosts(), www_redirect=False)
    app.add_middleware(HeadAsGet)  # outermost: a HEAD is the GET it stands for, all the way in (app/api/head.py)
    app.include_router(api_router)
    mount_frontend(app)  # last: it serves `/`, after the API routes
    return app


try:
    app = create_app()
except InsecureConfiguration as exc:  # `uvicorn pipeboard.app.main:app` stops with this one line
    raise SystemExit(f"pipeboard: {exc}") from None
