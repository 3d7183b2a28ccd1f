"""Request bodies: in the content type the route declares, and no larger than the server accepts.

- JSON routes take `application/json` (or `application/*+json`), upload routes
  `multipart/form-data`; any other type is a 415 before the body is read (ServiceRoute).
- Sizes: MAX_BODY_BYTES on JSON routes, MAX_UPLOAD_BYTES (plus room for the multipart framing) on
  upload routes. Streamed bytes are counted by Starlette's RequestBodyLimitMiddleware, which
  FastAPI puts on each route given a `max_body_size` (ServiceRoute gives every one of them its
  limit); a declared Content-Length over the limit is answered here at once, as JSON (Starlette's
  own answer to it is a plain-text "Content Too Large").
"""

from __future__ import annotations

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from pipeboard.app.core.config import Settings

# Room for the multipart framing around an upload of MAX_UPLOAD_BYTES (boundaries, part headers,
# the other form fields): the route itself refuses a larger file with its own 413.
MULTIPART_SLACK_BYTES = 64 * 1024
JSON_TYPES = ("application/json",)
FORM_TYPES = ("multipart/form-data",)


def body_limit(settings: Settings, multipart: bool) -> tuple[int, str]:
    """The largest body of this kind, and the setting that says so."""
    if multipart:
        return settings.max_upload_bytes + MULTIPART_SLACK_BYTES, "PIPEBOARD_MAX_UPLOAD_BYTES"
    return settings.max_body_bytes, "PIPEBOARD_MAX_BODY_BYTES"


def too_large(size: str, limit: int, setting: str) -> str:
    return f"request body: {size} is over the {limit} bytes this route accepts ({setting})"


def media_type(headers: Headers) -> str:
    return headers.get("content-type", "").partition(";")[0].strip().lower()


def has_body(request: Request) -> bool:
    length = request.headers.get("content-length")
    return "transfer-encoding" in request.headers or (length is not None and length.strip() != "0")


def check_content_type(request: Request, kind: str) -> None:
    """415 unless the body's Content-Type is the one the route reads (`json` or `form`)."""
    sent = media_type(request.headers)
    if kind == "json":
        if sent in JSON_TYPES or (sent.startswith("application/") and sent.endswith("+json")):
            return
        raise HTTPException(415, f"Content-Type: this route takes a JSON body (send 'Content-Type: application/json'), "
                                 f"got {sent or 'none'!r}")
    if sent not in FORM_TYPES:
        raise HTTPException(415, f"Content-Type: this route takes an upload as multipart/form-data (field `file`), "
                                 f"got {sent or 'none'!r}")


class DeclaredLengthLimit:
    """413 at once, as JSON, for a request whose Content-Length is over the limit of its kind."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            length = headers.get("content-length", "").strip()
            if length.isdigit():
                limit, setting = body_limit(self.settings, media_type(headers).startswith("multipart/"))
                if int(length) > limit:
                    response = JSONResponse({"detail": too_large(f"Content-Length {length}", limit, setting)}, status_code=413)
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)
