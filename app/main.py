"""The FastAPI application: `create_app()`, and `app` for `uvicorn app.main:app`."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from app.api.router import api_router
from app.core.config import VERSION
from app.frontend import mount_frontend

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


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # Log the traceback for operators; the client only learns that it was our fault.
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return JSONResponse(status_code=500, content={"detail": f"internal error ({type(exc).__name__})"})


def create_app() -> FastAPI:
    app = FastAPI(title="pipeboard", description=DESCRIPTION, version=VERSION)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected_error)
    app.include_router(api_router)
    mount_frontend(app)  # last: it serves `/`, after the API routes
    return app


app = create_app()
