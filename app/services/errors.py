"""The one error type services raise; routes turn it into an HTTP 4xx with its message."""

from __future__ import annotations


class ServiceError(Exception):
    """A request the service cannot honour. ``status`` is the HTTP code, ``field`` what was wrong."""

    def __init__(self, message: str, *, status: int = 400, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.field = field


class NotFound(ServiceError):
    def __init__(self, what: str, ident: object) -> None:
        super().__init__(f"{what} {ident!r} not found", status=404, field="id")
